"""Hidden tests over every MBPP task: how many, what they catch, what they cost. Counts only: no MBPP
text goes into the results file.

  build      the hidden tests of every task (rlcode.rewards.hidden_build.build, the reference
             solutions in the sandbox) and its wall time; written to the user's cache like
             `make hidden-tests` unless --limit is given (XDG_CACHE_HOME moves the cache)
  coverage   hidden tests per task (median, minimum, maximum), tasks without any by reason
  catch      per task whose every visible assert has a template, a special-casing program: it
             returns each visible assert's expected value for its input and, for any other input,
             None ("none") or the first visible expected value ("first"); how many pass the visible
             asserts (mbpp_tests 1.0) and how many of those mbpp_hidden_tests flags ``hardcoded``
  reference  reference solutions scoring 1.0 under mbpp_tests and under mbpp_hidden_tests
  alternatives  the sanitized MBPP file's solutions where they differ from the full file's (92
             tasks): of those passing the full task's visible asserts, how many pass its hidden
             tests too (the others are flagged ``hardcoded``: an alternative that is wrong on an
             input no assert shows, or a correct one judged on an input outside the task's domain)
  cost       seconds to score every reference solution with each reward on one pool (the median
             of 3 alternated runs), and the ratio

Peer: mbpp_tests (the visible asserts alone).

Run: .venv/bin/python benchmarks/hidden_tests_coverage.py [--limit N] [--workers 2] [--seed 0] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from run_record import run_record  # noqa: E402  (a sibling: the script directory is on sys.path)
from rlcode.data.hidden_tests import data_file, summary  # noqa: E402
from rlcode.data.mbpp import load_mbpp  # noqa: E402
from rlcode.rewards import MBPPHiddenTestsPassed, MBPPTestsPassed  # noqa: E402
from rlcode.rewards.hidden_build import build, cache_path, file_sha256, write_cache  # noqa: E402
from rlcode.rewards.hidden_tests import NoTemplate, template_of  # noqa: E402
from rlcode.sandbox import SandboxPool  # noqa: E402

REWARD_TIMEOUT_S = 10.0  # the rewards' default
REPEATS = 3  # timed scorings of the references per reward


def special_casing(task, fallback: str) -> str | None:
    """The program, or None when some visible assert has no template."""
    try:
        found = [template_of(test, task.entry_point or "") for test in task.test_list]
    except NoTemplate:
        return None
    lines = [f"def {task.entry_point}(*args, **kwargs):"]
    for template in found:
        call = template.call(template.args, template.keywords)
        inside = call[len(task.entry_point) + 1:-1]
        lines.append(f"    if (args, kwargs) == _args({inside}): return {template.expected}")
    lines.append(f"    return {found[0].expected if fallback == 'first' else 'None'}")
    lines.append("def _args(*args, **kwargs):\n    return args, kwargs")
    return "\n".join(lines) + "\n"


def alternatives(path, tasks, hidden: dict, visible, judged) -> dict:
    """The sanitized file's differing solutions against the full tasks' visible and hidden tests."""
    try:
        other = {t.task_id: t.code for t in load_mbpp(path, split="all", variant="sanitized")}
    except Exception:  # no sanitized file beside the full one
        return {}
    same = [t for t in tasks if t.task_id in other and _normal(other[t.task_id]) != _normal(t.code)]
    if not same:
        return {"programs": 0}
    batch = rows(same, hidden)
    codes = [other[t.task_id] for t in same]
    passed_visible = visible(completions=codes, **batch)
    passed_all = judged(completions=codes, **batch)
    passing = sum(v == 1.0 for v in passed_visible)
    return {"programs": len(same), "pass_visible": passing,
            "pass_visible_and_hidden": sum(v == 1.0 and h == 1.0 for v, h in zip(passed_visible, passed_all)),
            "flagged_hardcoded": sum(bool(s.hardcoded) for s in judged.last_scored)}


def _normal(code: str) -> str:
    return code.replace("\r\n", "\n").strip()


def rows(tasks, hidden: dict) -> dict:
    return {"task_id": [t.task_id for t in tasks], "test_list": [list(t.test_list) for t in tasks],
            "test_setup_code": [t.test_setup_code for t in tasks], "entry_point": [t.entry_point for t in tasks],
            "hidden_tests": [hidden[t.task_id] for t in tasks]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="first N tasks only (no cache written)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    path = data_file(None)
    if path is None:
        raise SystemExit("set MBPP_DATASET_PATH to a local mbpp.jsonl")
    tasks = load_mbpp(path, split="all")[: args.limit]
    record = {"script": "benchmarks/hidden_tests_coverage.py", "run": run_record(threads=args.workers),
              "data_sha256": file_sha256(path), "seed": args.seed, "workers": args.workers, "limit": args.limit}
    with SandboxPool(workers=args.workers, timeout=REWARD_TIMEOUT_S) as pool:
        started = time.perf_counter()
        cache = build(pool, tasks, seed=args.seed)
        record["build_seconds"] = round(time.perf_counter() - started, 1)
        if args.limit is None:
            cache["data_sha256"], cache["seconds"] = record["data_sha256"], record["build_seconds"]
            write_cache(record["data_sha256"], cache)
            print(f"cache written: {cache_path(record['data_sha256'])}")
        record["coverage"] = summary(cache)
        hidden = {int(k): entry["tests"] for k, entry in cache["tasks"].items()}
        with_hidden = [t for t in tasks if hidden[t.task_id]]
        columns = rows(with_hidden, hidden)
        visible, judged = MBPPTestsPassed(pool=pool), MBPPHiddenTestsPassed(pool=pool)

        record["catch"] = {}
        for fallback in ("none", "first"):
            programs = [(t, special_casing(t, fallback)) for t in with_hidden]
            kept = [(t, p) for t, p in programs if p is not None]
            batch = rows([t for t, _ in kept], hidden)
            passed_visible = visible(completions=[p for _, p in kept], **batch)
            judged(completions=[p for _, p in kept], **batch)
            flagged = [s.hardcoded for s in judged.last_scored]
            passing = sum(v == 1.0 for v in passed_visible)
            caught = sum(f and v == 1.0 for f, v in zip(flagged, passed_visible))
            record["catch"][fallback] = {"programs": len(kept), "pass_visible": passing, "flagged_hardcoded": caught,
                                         "flagged_share": round(caught / passing, 4) if passing else None}

        record["alternatives"] = alternatives(path, with_hidden, hidden, visible, judged)

        references = [t.code for t in with_hidden]
        timings = {"mbpp_tests": {"runs": []}, "mbpp_hidden_tests": {"runs": []}}
        for _ in range(REPEATS):  # alternated, so drifting load falls on both alike
            for name, reward in (("mbpp_tests", visible), ("mbpp_hidden_tests", judged)):
                started = time.perf_counter()
                scores = reward(completions=references, **columns)
                timings[name]["runs"].append(time.perf_counter() - started)
                timings[name].update(passed=int(sum(scores)), scored=len(scores))
        for timing in timings.values():
            timing["seconds"] = round(sorted(timing["runs"])[REPEATS // 2], 2)  # the median run
        record["reference"] = {name: {k: timings[name][k] for k in ("passed", "scored")} for name in timings}
        record["cost"] = {"tasks": len(references),
                          "seconds": {name: timings[name]["seconds"] for name in timings},
                          "ratio_hidden_vs_visible": round(timings["mbpp_hidden_tests"]["seconds"]
                                                           / timings["mbpp_tests"]["seconds"], 2)}
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
