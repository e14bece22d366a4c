"""What the host's page cache still carries between executions once drops and probes are refused.

The sandbox ignores fadvise DONTNEED (and madvise PAGEOUT/COLD) and refuses RWF_NOWAIT, so a sample
can neither evict a shared file's pages nor test them without loading them. What is left is loading
and timing: a writer (one execution) reads chosen pages of a stdlib file no process has read lately;
a reader (a later execution, on either worker) times a one-byte read of each page, ~1-5 us from the
cache and far more from disk, and decodes a 1 where a page was fast. The reads load every page, so a
page carries one bit once, until memory pressure evicts it again.

Pages start cold here because this script (outside the sandbox) drops them before each trial: it
stands in for files nothing has read since the kernel let them go, which a real writer would have
to find. Reports per trial the bits sent and decoded right, and the rate per pair and per second.

Run: .venv/bin/python benchmarks/page_cache_channel.py [--bits 64] [--trials 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import sysconfig
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from run_record import run_record  # noqa: E402  (a sibling: the script directory is on sys.path)
from rlcode.sandbox import SandboxPool, Status  # noqa: E402

FILE = os.path.join(sysconfig.get_paths()["stdlib"], "pydoc_data", "topics.py")
THRESHOLD_NS = 30_000  # a cached page reads in ~1-5 us, one from disk in 100+ us (decided before the runs)
OPEN_FOR_RANDOM = ("import os, time\nPATH = os.path.join(os.path.dirname(os.__file__), 'pydoc_data', 'topics.py')\n"
                   "fd = os.open(PATH, os.O_RDONLY)\n"
                   "os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: one page per read\n")


def writer(bits: list[int]) -> str:
    return OPEN_FOR_RANDOM + f"for page, bit in enumerate({bits}):\n    if bit:\n        os.pread(fd, 1, page * 4096)\n"


def reader(count: int) -> str:
    return OPEN_FOR_RANDOM + (f"times = []\nfor page in range({count}):\n    started = time.perf_counter_ns()\n"
                              "    os.pread(fd, 1, page * 4096)\n    times.append(time.perf_counter_ns() - started)\n"
                              "print(times)\n")


def drop_pages(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, default=64)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    pages = os.path.getsize(FILE) // 4096
    if args.bits > pages:
        sys.exit(f"{FILE} has {pages} pages: at most {pages} bits")
    record, rng, trials = run_record(threads=2), random.Random(args.seed), []
    with SandboxPool(workers=2, timeout=30.0) as pool:
        for _ in range(args.trials):
            sent = [rng.randint(0, 1) for _ in range(args.bits)]
            drop_pages(FILE)
            wrote = pool.submit(writer(sent)).result()
            started = time.perf_counter()
            read = pool.submit(reader(args.bits)).result()
            elapsed = time.perf_counter() - started
            if wrote.status is not Status.OK or read.status is not Status.OK:
                sys.exit(f"a sample failed: {wrote.stderr[-300:]} {read.stderr[-300:]}")
            times = json.loads(read.stdout)
            decoded = [int(t < THRESHOLD_NS) for t in times]
            right = sum(a == b for a, b in zip(sent, decoded))
            trials.append({"bits": args.bits, "right": right, "reader_s": round(elapsed, 4),
                           "fast_ns_median": sorted(t for t, b in zip(times, sent) if b)[len(times) // 4] if any(sent) else None,
                           "slow_ns_min": min((t for t, b in zip(times, sent) if not b), default=None)})
            print(trials[-1])
        level = pool.isolation.level
    bits, right = sum(t["bits"] for t in trials), sum(t["right"] for t in trials)
    summary = {"bits_sent": bits, "bits_right": right, "error_rate": 1 - right / bits,
               "bits_per_pair": bits / len(trials), "reader_seconds_per_pair": sum(t["reader_s"] for t in trials) / len(trials)}
    print(json.dumps(summary))
    if args.out:
        shown = "<stdlib>/" + os.path.relpath(FILE, sysconfig.get_paths()["stdlib"])  # no path of this machine
        Path(args.out).write_text(json.dumps({"run": record, "isolation": level, "file": shown,
                                              "threshold_ns": THRESHOLD_NS, "trials": trials,
                                              "summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
