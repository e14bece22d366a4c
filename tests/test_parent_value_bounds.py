"""The trusted parent's memory and work per sample stay bounded whatever a sample writes.

The values stream (fd 3) keeps one line per probe + VALUE_LINES_SPARE and max_values_bytes; status
lines, exception names and every verdict string are cut. The worker applies the caps, the same code
at every isolation level, so these run at the pool's default level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlcode.data.mbpp import load_mbpp
from rlcode.sandbox import SandboxPool
from rlcode.sandbox.inside.outcome import ERROR_TYPE_CHARS, VALUE_LINES_SPARE
from rlcode.sandbox.job_queue import Job
from rlcode.sandbox.launch import Limits
from rlcode.sandbox.result import Program
from rlcode.sandbox.verdict import REASON_CHARS, _probe_values, check_against_tests
from rlcode.sandbox.worker_slot import PIPELINE_DEPTH, result_from_worker

REPO = Path(__file__).resolve().parents[1]
TESTS = ["assert f(3) == 6", "assert f(0) == 0"]
HONEST = "def f(x):\n    return 2 * x\n"
# 8 MiB of one-byte lines on the values fd, then the right answer: 4.2M lines before the cap.
LINE_FLOOD = "import os\nfor _ in range(64):\n    os.write(3, b'1\\n' * 65536)\n"


def _forged_status(field: str) -> str:
    return f"import os\nos.write(3, b'{{\"s\":\"error\",\"e\":\"' + b'A' * 7_000_000 + b'\"{field}}}\\n')\nos._exit(1)\n"


def test_forged_and_flooding_values_give_bounded_verdicts_that_say_why():
    """Guards the caps: a forged status line with a 7M-character error field gives a reason of at
    most REASON_CHARS (it was the whole field), and a line flood fails naming the lines cap, with at
    most one line per probe + VALUE_LINES_SPARE reaching the parent."""
    with SandboxPool(workers=1, timeout=10.0) as pool:
        forged = check_against_tests(pool, _forged_status(""), TESTS).result(timeout=60)
        flood = pool.submit(Program(LINE_FLOOD + HONEST, probes=("f(3)",))).result()
        flood_verdict = check_against_tests(pool, LINE_FLOOD + HONEST, TESTS).result(timeout=60)
        honest = check_against_tests(pool, HONEST, TESTS).result(timeout=60)
    assert not forged.all_passed and forged.reason.startswith("error: AAA")
    assert len(forged.reason) <= len("error: ") + ERROR_TYPE_CHARS <= REASON_CHARS
    assert flood.values_over == "lines" and flood.values_lines == 64 * 65536 + 2  # + f(3), status
    assert len(flood.probe_lines) <= 1 + VALUE_LINES_SPARE
    assert not flood_verdict.all_passed and flood_verdict.reason.startswith("values over the lines cap")
    assert honest.all_passed and honest.reason == "passed"


def _parent_cost_at_the_cap() -> float:
    """CPU seconds the parent spends on one result whose values stream sits at both caps (the most
    any sample can hand it): the protocol line's decode, the result, and the probe decode."""
    lines = 2 + VALUE_LINES_SPARE
    line = '{"i":0,"v":"%s"}' % ("a" * (Limits().max_values_bytes // lines - 20))
    raw = json.dumps({"status": "ok", "probe_lines": [line] * lines, "values_over": "bytes"})
    job = Job(exec_id="x", program=Program(HONEST, probes=("f(3)", "f(0)")), timeout=1.0, tags={},
              reference=False, future=None)
    started = time.process_time()
    _probe_values(result_from_worker(job, json.loads(raw), "bwrap"), 2)
    return time.process_time() - started


EVAL_RUN = """
import json, resource, sys
from rlcode.eval.cli import main
code = main(sys.argv[1:])
usage = resource.getrusage(resource.RUSAGE_SELF)  # this process alone: the workers are children
print(json.dumps({"code": code, "rss_kb": usage.ru_maxrss, "cpu_s": usage.ru_utime + usage.ru_stime}), file=sys.stderr)
"""


def _eval_run(tmp_path: Path, name: str, codes: list[tuple[int, str]], workers: int) -> dict:
    samples = tmp_path / f"{name}.jsonl"
    samples.write_text("".join(json.dumps({"task_id": t, "completion": c}) + "\n" for t, c in codes))
    done = subprocess.run([sys.executable, "-c", EVAL_RUN, str(samples), "--workers", str(workers)],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, done.stderr[-2000:]
    results = [json.loads(line) for line in (tmp_path / f"{name}_results.jsonl").read_text().splitlines()]
    return {**report, "results": results}


@pytest.mark.slow
def test_rlcode_eval_peak_memory_and_cpu_on_line_floods_stay_near_honest_runs(tmp_path):
    """Guards the parent as a user runs it: 10 MBPP samples that each flood the values fd with 8 MiB
    of one-byte lines (before: ~375 MB and ~20 s of parent CPU each, 1160 MB peak for 3) cost
    rlcode-eval no more than 10 honest ones plus derived constants:
      memory: the values in flight at once, (workers + the reference worker) x PIPELINE_DEPTH
              results, each at most max_values_bytes; the flood is far below that, so peak RSS
              within that of the honest run plus that sum does not grow with N;
      CPU:    N x the parent's cost of one result at both caps (measured here, same process kind)."""
    tasks = load_mbpp(None, "test")[:10]
    workers = 2
    honest = _eval_run(tmp_path, "honest", [(t.task_id, t.code) for t in tasks], workers)
    flood = _eval_run(tmp_path, "flood", [(t.task_id, LINE_FLOOD + t.code) for t in tasks], workers)
    assert [r["passed"] for r in honest["results"]] == [True] * len(tasks), honest["results"]
    assert all(not r["passed"] and r["result"].startswith("values over the lines cap") for r in flood["results"])
    values_in_flight_kb = (workers + 1) * PIPELINE_DEPTH * Limits().max_values_bytes // 1024
    assert flood["rss_kb"] <= honest["rss_kb"] + values_in_flight_kb, (flood["rss_kb"], honest["rss_kb"])
    assert flood["cpu_s"] <= honest["cpu_s"] + len(tasks) * _parent_cost_at_the_cap(), (flood, honest)
