"""MBPP's hidden tests: built once per data file, cached, and looked up by task for the DataModule.

    python -m rlcode.data.hidden_tests --build [--source mbpp.jsonl] [--seed 0] [--workers N]
    make hidden-tests

builds the hidden tests of every task of the file (all splits: the reward may score any of them)
with ``rlcode.rewards.hidden_build`` and writes the cache it names (keyed by the file's sha256).
The DataModule reads the cache with :func:`hidden_tests_by_task` and sends each task's tests as the
``hidden_tests`` column; without a cache the column is absent and the hidden-test rewards say so.

Only local files have a cache: a hub id or a folder without ``mbpp.jsonl`` /
``sanitized-mbpp.json`` has no single file to hash.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from pathlib import Path

from rlcode.data.mbpp import ENV_VAR, load_mbpp
from rlcode.rewards.hidden_build import build, cache_path, file_sha256, read_cache, write_cache
from rlcode.sandbox import SandboxPool


def data_file(source: str | os.PathLike | None) -> Path | None:
    """The one local file ``source`` names (a folder: its ``mbpp.jsonl``, else its
    ``sanitized-mbpp.json``), or None (a hub id, a folder of parquet parts)."""
    source = source or os.environ.get(ENV_VAR)
    if not source:
        return None
    path = Path(source).expanduser()
    if path.is_dir():
        path = next((path / name for name in ("mbpp.jsonl", "sanitized-mbpp.json")
                     if (path / name).is_file()), path)
    return path if path.is_file() else None


def hidden_tests_by_task(source: str | os.PathLike | None) -> dict[int, list[str]] | None:
    """Task id -> its hidden tests (empty when none could be made), from the cache of ``source``'s
    data file; None when there is no cache for it (not built, or by another generator version)."""
    path = data_file(source)
    cache = read_cache(file_sha256(path)) if path is not None else None
    if cache is None:
        return None
    return {int(task_id): list(entry.get("tests") or []) for task_id, entry in cache["tasks"].items()}


def build_cache(source: str | os.PathLike | None, seed: int = 0, workers: int | None = None) -> dict:
    """Build and write the cache of ``source``'s data file; returns the cache plus ``seconds``."""
    path = data_file(source)
    if path is None:
        raise SystemExit(f"hidden tests need a local MBPP file: pass --source or set {ENV_VAR}")
    started = time.perf_counter()
    tasks = load_mbpp(path, split="all")
    # Short executions: the reference's values for a task's inputs take well under a second
    # (MBPP's slowest reference, task 123, is cut by the build's own timeout).
    with SandboxPool(workers=workers, timeout=4.0) as pool:
        cache = build(pool, tasks, seed=seed)
    cache["data_sha256"] = file_sha256(path)
    cache["seconds"] = round(time.perf_counter() - started, 1)
    write_cache(cache["data_sha256"], cache)
    return cache


def summary(cache: dict) -> dict:
    """Counts only (no task text): tests per task, tasks without tests by reason."""
    counts = sorted(len(entry["tests"]) for entry in cache["tasks"].values())
    reasons = Counter(entry["reason"] for entry in cache["tasks"].values() if not entry["tests"])
    middle = len(counts) // 2
    median = (counts[middle] if len(counts) % 2 else (counts[middle - 1] + counts[middle]) / 2) if counts else 0
    some = [count for count in counts if count]
    return {"tasks": len(counts), "tests": sum(counts), "median_per_task": median,
            "min_per_task": counts[0] if counts else 0, "max_per_task": counts[-1] if counts else 0,
            "min_per_task_with_tests": some[0] if some else 0,
            "tasks_without": sum(reasons.values()), "without_by_reason": dict(sorted(reasons.items()))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlcode.data.hidden_tests", description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="store_true", help="build the cache (else: show where it is)")
    parser.add_argument("--source", default=None, help=f"MBPP file or folder (default: ${ENV_VAR})")
    parser.add_argument("--seed", type=int, default=0, help="global mutation seed (default 0)")
    parser.add_argument("--workers", type=int, default=None, help="sandbox workers (default: one per core)")
    args = parser.parse_args(argv)
    path = data_file(args.source)
    if path is None:
        print(f"no local MBPP file: pass --source or set {ENV_VAR}", file=sys.stderr)
        return 2
    if args.build:
        cache = build_cache(path, seed=args.seed, workers=args.workers)
    else:
        cache = read_cache(file_sha256(path))
        if cache is None:
            print(f"no hidden tests built for {path.name}: run with --build", file=sys.stderr)
            return 1
    print(f"{cache_path(file_sha256(path))}: {summary(cache)}"
          + (f", built in {cache['seconds']} s" if args.build else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
