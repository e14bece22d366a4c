"""pass@k against hand-computed values, and the rlcode-eval command end to end (as a subprocess)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from fractions import Fraction

import pytest

from rlcode.eval.passk import mean_pass_at_k, pass_at_k

FENCE = "```"


# -- pass@k ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n, c, k, expected", [
    (1, 1, 1, 1.0),
    (1, 0, 1, 0.0),
    (10, 3, 1, 0.3),                                  # pass@1 = c / n
    (5, 2, 2, 1 - Fraction(3, 10)),                   # 1 - C(3,2)/C(5,2)
    (4, 1, 2, 0.5),                                   # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (20, 5, 10, 1 - Fraction(3003, 184756)),          # 1 - C(15,10)/C(20,10)
    (10, 3, 8, 1.0),                                  # n - c < k: every draw holds a correct one
    (200, 0, 100, 0.0),
])
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    # C(1000, 500) overflows floats; the product form does not.
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)


def test_pass_at_k_rejects_bad_counts():
    for n, c, k in ((3, 4, 1), (3, 1, 0), (3, 1, 4)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_mean_pass_at_k_leaves_out_tasks_with_too_few_samples():
    counts = {"a": (1, 1), "b": (10, 0), "c": (10, 5)}
    result = mean_pass_at_k(counts, [1, 10, 20])
    assert result["pass@1"] == pytest.approx((1.0 + 0.0 + 0.5) / 3)
    assert result["pass@10"] == pytest.approx((0.0 + 1.0) / 2)  # task "a" has n = 1 < 10
    assert "pass@20" not in result


# -- the command -----------------------------------------------------------------------------------

TASKS = [  # synthetic tasks in the test split (ids 11-510)
    {"task_id": 11, "text": "Add.", "code": "def add(a, b):\n    return a + b",
     "test_list": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"],
     "test_setup_code": "", "challenge_test_list": []},
    {"task_id": 12, "text": "Double.", "code": "def double(x):\n    return 2 * x",
     "test_list": ["assert double(2) == 4", "assert double(0) == 0", "assert double(-3) == -6"],
     "test_setup_code": "", "challenge_test_list": []},
]


def _run(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlcode.eval.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=cwd)


@pytest.fixture()
def dataset(tmp_path):
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    return path


def _samples(tmp_path, rows, name="samples.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_results_file_and_summary(tmp_path, dataset):
    rows = [
        {"task_id": 11, "completion": f"Sure:\n{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}",
         "model": "m"},
        {"task_id": 11, "completion": "def add(a, b):\n    return a - b"},
        {"task_id": 12, "completion": [{"role": "assistant", "content": "def double(x): return x + x"}]},
        {"task_id": "Mbpp/12", "completion": "import sys\ndef double(x): return 4\nsys.exit(0)"},
        {"task_id": 12, "completion": "def double(x) return x"},
    ]
    samples = _samples(tmp_path, rows)
    proc = _run(samples, "--dataset", dataset, "--k", "1,2,5", "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    # task 11: n=2, c=1; task 12: n=3, c=1. pass@5 is left out (no task has 5 samples).
    assert summary == {"pass@1": pytest.approx((1 / 2 + 1 / 3) / 2),
                       "pass@2": pytest.approx((1.0 + (1 - 1 / 3)) / 2),
                       "tasks": 2, "samples": 5, "passed": 2}
    results = [json.loads(line) for line in (tmp_path / "samples_results.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in results] == [11, 11, 12, "Mbpp/12", 12]
    assert [r["passed"] for r in results] == [True, False, True, False, False]
    assert results[0]["model"] == "m" and results[0]["result"] == "passed"
    assert results[1]["result"] == "assert 1 failed: got -1, expected 3"
    assert results[3]["result"] == "exited before tests ran"
    assert results[4]["result"] == "syntax_error"


def test_zero_pass_rate_still_exits_zero(tmp_path, dataset):
    samples = _samples(tmp_path, [{"task_id": 11, "completion": "pass"}])
    proc = _run(samples, "--dataset", dataset)
    assert proc.returncode == 0
    assert json.loads(proc.stdout.splitlines()[-1]) == {"pass@1": 0.0, "tasks": 1, "samples": 1, "passed": 0}


def test_missing_file(tmp_path, dataset):
    proc = _run(tmp_path / "absent.jsonl", "--dataset", dataset)
    assert proc.returncode != 0 and "no such file" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_unknown_task_id_names_the_line(tmp_path, dataset):
    samples = _samples(tmp_path, [{"task_id": 11, "completion": "def add(a, b): return a + b"},
                                  {"task_id": 999, "completion": ""}])
    proc = _run(samples, "--dataset", dataset)
    assert proc.returncode == 2
    assert "samples.jsonl:2: unknown task_id 999 in the MBPP test split\n" in proc.stderr  # no split has it: no hint
    results = [json.loads(line) for line in (tmp_path / "samples_results.jsonl").read_text().splitlines()]
    assert results[0]["passed"] is True and results[1] == {"line": 2, "error": "unknown task_id 999 in the MBPP test split"}


def test_split_hint_only_where_another_split_has_the_task(tmp_path):
    """The hint names the split that holds the task, and is absent where none does (--split all)."""
    data = tmp_path / "mbpp.jsonl"
    data.write_text("".join(json.dumps(dict(t, task_id=i)) + "\n" for t, i in zip(TASKS, (11, 600))))
    samples = _samples(tmp_path, [{"task_id": 600, "completion": ""}, {"task_id": 7, "completion": ""}])
    proc = _run(samples, "--dataset", data)
    assert "samples.jsonl:1: unknown task_id 600 in the MBPP test split: it is in the validation split" in proc.stderr
    assert "samples.jsonl:2: unknown task_id 7 in the MBPP test split\n" in proc.stderr
    proc = _run(samples, "--dataset", data, "--split", "all", "--overwrite")
    assert proc.returncode == 2 and "unknown task_id 7 in the MBPP all split\n" in proc.stderr
    assert "--split" not in proc.stderr


@pytest.mark.parametrize("task_id", ["Mbpp/\u00b2", "\u2460\u2466", "9" * 5000, "\u0661\u0667", 10**12, -1, True])
def test_task_ids_are_ascii_digits_of_bounded_length(tmp_path, dataset, task_id):
    """Superscripts, circled digits and 5,000 digits were a ValueError traceback; Arabic-Indic "17"
    silently became task 17. Each is now a bad line; the good line beside it is scored."""
    samples = _samples(tmp_path, [{"task_id": task_id, "completion": ""},
                                  {"task_id": 11, "completion": "def add(a, b): return a + b"}])
    proc = _run(samples, "--dataset", dataset)
    assert proc.returncode == 2 and "samples.jsonl:1: task_id must be a task number" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    results = [json.loads(line) for line in (tmp_path / "samples_results.jsonl").read_text().splitlines()]
    assert results[0]["line"] == 1 and results[1]["passed"] is True


def test_a_results_path_that_is_a_directory_stops_before_any_sample_runs(tmp_path, dataset):
    samples = _samples(tmp_path, [{"task_id": 11, "completion": "import time; time.sleep(30)"}])
    (tmp_path / "samples_results.jsonl").mkdir()
    proc = _run(samples, "--dataset", dataset, "--timeout", "60")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "samples_results.jsonl is a directory" in lines[0], proc.stderr


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", "malformed JSON line"),
    ('{"task_id": 11}', 'each line needs "task_id" and "completion"'),
    ('{"task_id": [1], "completion": ""}', "task_id must be a task number"),
    # Deeper than the JSON decoder's own recursion guard: a RecursionError traceback before.
    ('{"task_id": 11, "completion": ' + "[" * 100_000 + "]" * 100_000 + "}", "malformed JSON line (nested too deeply)"),
    ('{"task_id": 11, "completion": ' + '{"a":' * 100_000 + "1" + "}" * 100_000 + "}", "malformed JSON line (nested too deeply)"),
    # Decodable, but too deep for what follows (str() of it, writing its result line back).
    ('{"task_id": 11, "completion": ' + "[" * 900 + "]" * 900 + "}", "malformed JSON line (nested deeper than 100 levels)"),
    ('{"task_id": 11, "completion": ' + "[" * 900 + "1" + "]" * 900, "malformed JSON line"),
    ('{"task_id": 11, "completion": ' + "9" * 5000 + "}", "malformed JSON line (Exceeds the limit"),
    ("[" * 5000, "malformed JSON line"),
    ('"just a string"', 'each line needs "task_id" and "completion"'),
])
def test_malformed_line_names_the_line(tmp_path, dataset, bad_line, message):
    """A bad input line of any shape is one line on stderr naming it and an error row in the
    results; the good lines around it are scored and written; exit status 2."""
    samples = tmp_path / "s.jsonl"
    good = json.dumps({"task_id": 11, "completion": "def add(a, b): return a + b"})
    samples.write_text(good + "\n\n" + bad_line + "\n" + good + "\n")
    proc = _run(samples, "--dataset", dataset)
    assert proc.returncode == 2 and f"s.jsonl:3: {message}" in proc.stderr
    assert [line for line in proc.stderr.splitlines() if "s.jsonl:" in line] == [
        line for line in proc.stderr.splitlines() if line.startswith("rlcode-eval: ")], proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("rlcode-eval: ")]) == 1, proc.stderr
    results = [json.loads(line) for line in (tmp_path / "s_results.jsonl").read_text().splitlines()]
    assert [r.get("passed") for r in results] == [True, None, True]
    assert results[1]["line"] == 3 and results[1]["error"].startswith(message)
    assert json.loads(proc.stdout.splitlines()[-1])["bad_lines"] == 1


def test_every_sample_of_any_shape_gets_one_result_line(tmp_path, dataset):
    """Completions of every JSON shape (within the depth limit) are scored: one result line per
    sample, in order, beside an honest sample that still passes."""
    honest = {"task_id": 11, "completion": "def add(a, b):\n    return a + b"}
    odd = [None, 3, 2.5, True, {}, [], {"content": None}, [{"content": [{"text": 5}, None, [1, [2]]]}],
           [{"role": "user", "content": "x"}], [[[[["def add(a, b): return a + b"]]]]],
           {"role": "assistant", "content": [{"type": "text"}]}, "\n" * 200_000, "`" * 100_000,
           "[BEGIN]" * 10_000,
           # a base model's answer, then prose and a fence: scored on the answer (it passes)
           "def add(a, b):\n    return a + b\n[DONE]\nExplanation ...\n" + FENCE + "\nfoo bar"]
    nested = {"task_id": 12, "completion": "", "extra": json.loads("[" * 98 + "]" * 98)}
    rows = [honest] + [{"task_id": 11, "completion": c} for c in odd] + [nested, honest]
    proc = _run(_samples(tmp_path, rows), "--dataset", dataset)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in (tmp_path / "samples_results.jsonl").read_text().splitlines()]
    assert len(results) == len(rows)
    assert [r["completion"] for r in results] == [r["completion"] for r in rows]
    assert [r["passed"] for r in results] == [True] + [False] * 14 + [True, False, True]


def test_bad_k_and_missing_dataset(tmp_path, dataset):
    samples = _samples(tmp_path, [{"task_id": 11, "completion": ""}])
    assert "--k takes" in _run(samples, "--dataset", dataset, "--k", "0").stderr
    proc = _run(samples, "--dataset", tmp_path / "nowhere.jsonl")
    assert proc.returncode != 0 and "MBPP_DATASET_PATH" in proc.stderr


def test_doctor_prints_the_isolation_report():
    """Guards --doctor: it names every layer, the per-execution ones included."""
    proc = _run("--doctor")
    assert proc.returncode == 0 and proc.stdout.startswith("sandbox isolation:")
    for layer in ("landlock", "cgroup_limits", "tmpfs_per_execution", "ipc_objects_denied", "seccomp",
                  "sandbox_uid", "process_limit_per_execution"):
        assert f"] {layer}" in proc.stdout, proc.stdout
    # and which mechanism bounds an execution's processes
    mechanisms = "cgroup-pids|slot-uid|userns|shared-uid|none"
    assert re.search(rf"process_limit_per_execution: ({mechanisms}): ", proc.stdout), proc.stdout


def test_help_states_the_timeout_policy():
    proc = _run("--help")
    assert proc.returncode == 0 and "task 123" in proc.stdout and "default 10" in proc.stdout


def test_an_existing_results_file_is_kept_unless_overwrite_is_given(tmp_path, dataset):
    samples = _samples(tmp_path, [{"task_id": 11, "completion": "def add(a, b): return a + b"}])
    results = tmp_path / "samples_results.jsonl"
    results.write_text("earlier results\n")
    proc = _run(samples, "--dataset", dataset)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"rlcode-eval: {results} exists: pass --overwrite to replace it, or move it away"], proc.stderr
    assert results.read_text() == "earlier results\n"
    proc = _run(samples, "--dataset", dataset, "--overwrite")
    assert proc.returncode == 0 and json.loads(results.read_text())["passed"] is True, proc.stderr


def test_cli_imports_no_heavy_packages():
    code = ("import sys; from rlcode.eval import cli; from rlcode.sandbox import verdict; "
            "import rlcode.rewards; import rlcode.data.mbpp; "
            "print(sorted(m for m in ('torch', 'transformers', 'datasets', 'pyarrow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_lone_surrogates_round_trip_and_results_are_written_atomically(tmp_path, dataset):
    """Guards the results file: a completion holding a lone surrogate (the valid JSON escape
    \\udcff) used to crash rlcode-eval after writing part of the file; now every input string reads
    back equal, and no temporary file is left beside the results."""
    rows = [{"task_id": 11, "completion": f"Here \udcff:\n{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}",
             "note": "x\ud800y"},
            {"task_id": 12, "completion": "def double(x):\n    return 2 * x"}]
    samples = tmp_path / "s.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))  # ASCII escapes, as JSON allows
    proc = _run(samples, "--dataset", dataset)
    assert proc.returncode == 0, proc.stderr
    results = [json.loads(line) for line in (tmp_path / "s_results.jsonl").read_text().splitlines()]
    assert [{k: r[k] for k in rows[i]} for i, r in enumerate(results)] == rows
    assert [r["passed"] for r in results] == [True, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mbpp.jsonl", "s.jsonl", "s_results.jsonl"]


def test_results_file_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """Guards the atomic write itself: a failure while writing keeps the previous file intact."""
    from rlcode.eval import cli

    target = tmp_path / "r.jsonl"
    target.write_text("previous\n")

    def failing_lines():
        yield "partial\n"
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        cli._write_atomically(target, failing_lines())
    assert target.read_text() == "previous\n" and [p.name for p in tmp_path.iterdir()] == ["r.jsonl"]
