"""Does training move MBPP pass@1? Greedy pass@1 on the 500 MBPP test problems before and after a
CPU run of a recipe, per seed, with McNemar's exact test on the same problems.

Each seed is one ``rlcode fit --config CONFIG`` (default ``benchmarks/configs/learn_mbpp_cpu.yaml``: its MBPP
eval callback scores the whole test split greedily at start and at end and writes every problem's
verdict to ``<run>/eval/step_<n>.json``). Greedy decoding of the same base model gives the same
baseline for every seed, so only the first seed evaluates at start and the others reuse it
(``--baseline-every-seed`` re-evaluates it each time). Reported per seed: pass@1 before -> after,
the problems that flipped each way (b: pass -> fail, c: fail -> pass) and the exact two-sided
McNemar p-value, 2 x P(X <= min(b, c)) for X ~ Binomial(b + c, 1/2). Two verdict files are compared
only when they record the same generation settings (``"generation"``: token limit, prompt format,
sampling, timeout, model precision...): otherwise one line names the setting that differs.

This script reports; ``benchmarks/learning_protocol.py`` decides what may be reported: it chooses
recipes off the test split and runs registered recipes on fresh seeds.

HumanEval (164 problems, never trained on) is the held-out benchmark: after each seed's fit,
``rlcode test --eval.benchmark humaneval`` scores the final checkpoint greedily, and once the base
model (reused by every seed like the MBPP baseline); the same table and test are reported for it
(``--no-humaneval`` skips it). Its verdicts are in ``eval/test_step_<n>.json`` beside the checkpoint, in ``<run>/runs/...``.

    .venv/bin/python benchmarks/learning_mbpp.py [--config benchmarks/configs/learn_mbpp_cpu.yaml [OVERLAY]] [--seeds 0 1 2]
        [--threads 2] [--json out.json] [-- any rlcode fit arguments]
    .venv/bin/python benchmarks/learning_mbpp.py --seeds 1 --baseline SEED0_RUN_DIR   # more seeds, in parallel
    .venv/bin/python benchmarks/learning_mbpp.py --from-runs RUN_DIR...   # summarize finished runs
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script: rlcode from this checkout
from rlcode.eval.settings import differing  # noqa: E402


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value from the discordant counts (1.0 when there are none)."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def eval_files(run: Path) -> dict[int, Path]:
    """Step -> eval JSON of a run directory (searched below it: runs/<experiment>/version_<n>/)."""
    found = {}
    for path in run.rglob("eval/step_*.json"):
        found[int(path.stem.split("_")[1])] = path
    return found


def training_minutes(run: Path) -> float | None:
    """The run's training steps alone, in minutes (``perf/step_s`` summed from the fit's metrics.csv, the
    one beside its step evals: HumanEval's test runs below ``run`` write their own): the fit's wall time
    also holds its evals. None when the fit left no evals or no metrics file."""
    files = eval_files(run)
    metrics = files[max(files)].parent.parent / "metrics.csv" if files else None
    if metrics is None or not metrics.is_file():
        return None
    with metrics.open() as handle:
        seconds = [float(row["perf/step_s"]) for row in csv.DictReader(handle) if row.get("perf/step_s")]
    return round(sum(seconds) / 60, 1)


def verdicts(path: Path) -> dict[int, bool]:
    report = json.loads(path.read_text())
    return {problem["task_id"]: bool(problem["passed"]) for problem in report["problems"]}


def scored_alike(before: Path, after: Path) -> tuple[Path, Path]:
    """The two verdict files, refused when their recorded generation settings differ (a before/after
    change would then measure the settings too); files written before settings were recorded pass."""
    setting = differing(json.loads(before.read_text()).get("generation"),
                        json.loads(after.read_text()).get("generation"))
    if setting is not None:
        raise ValueError(f"{before} and {after} were scored with a different {setting}: "
                         "score both with the same eval settings")
    return before, after


def base_model_verdicts(path: Path) -> Path:
    """``path``, refused when it names the checkpoint it scored: a trained seed's HumanEval verdicts
    (``eval/test_step_<n>.json``) have the same form of file name as the base model's. Verdict files
    written before rlcode recorded ``ckpt_path`` cannot be told apart and are taken as given."""
    checkpoint = json.loads(path.read_text()).get("ckpt_path")
    if checkpoint:
        raise SystemExit(f"--humaneval-baseline {path} scored the checkpoint {checkpoint}, a trained model: pass "
                         "the base model's verdicts (<root>/humaneval-base/.../eval/test_step_0.json)")
    return path


def compare(before: dict[int, bool], after: dict[int, bool]) -> dict:
    if before.keys() != after.keys():
        raise ValueError(f"the evals scored different problems ({len(before)} vs {len(after)}): "
                         "compare runs with the same eval split and num_questions")
    lost = sorted(task for task in before if before[task] and not after[task])
    gained = sorted(task for task in before if after[task] and not before[task])
    return {"problems": len(before), "passed_before": sum(before.values()), "passed_after": sum(after.values()),
            "pass_at_1_before": sum(before.values()) / len(before), "pass_at_1_after": sum(after.values()) / len(after),
            "lost": lost, "gained": gained, "mcnemar_p": mcnemar_exact(len(lost), len(gained))}


def fit(configs: list[Path], seed: int, root: Path, threads: int, at_start: bool,
        extra: list[str]) -> tuple[float, int]:
    """One seed's ``rlcode fit``: its minutes and exit code. A failed fit does not stop the benchmark:
    its end-of-run MBPP verdicts may already be written (a last checkpoint that fails to save comes after
    them), and the other seeds' hours are not thrown away."""
    overlays = [argument for config in configs for argument in ("--config", str(config))]
    command = [sys.executable, "-m", "rlcode.cli", "fit", *overlays, "--run.root_dir", str(root),
               "--data.seed", str(seed), "--model.generation_seed", str(seed), "--run.cpu_threads", str(threads),
               "--eval.at_start", str(at_start).lower(), *extra]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    started = time.perf_counter()
    code = subprocess.run(command, cwd=REPO).returncode
    return (time.perf_counter() - started) / 60, code


def humaneval_test(configs: list[Path], root: Path, threads: int, checkpoint: Path | None) -> Path:
    """Greedy HumanEval pass@1 of the recipe's model (the base model, or ``checkpoint``'s weights):
    ``rlcode test --eval.benchmark humaneval``; the path of its per-problem verdicts."""
    overlays = [argument for config in configs for argument in ("--config", str(config))]
    command = [sys.executable, "-m", "rlcode.cli", "test", *overlays, "--run.root_dir", str(root),
               "--run.cpu_threads", str(threads), "--eval.benchmark", "humaneval",
               *(["--ckpt_path", str(checkpoint)] if checkpoint is not None else [])]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, cwd=REPO, check=True)
    return humaneval_file(root if checkpoint is None else checkpoint.parent.parent)  # beside the checkpoint's run


def humaneval_file(root: Path) -> Path:
    found = sorted(root.rglob("eval/test_step_*.json"), key=lambda path: path.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"{root} has no eval/test_step_*.json: did rlcode test --eval.benchmark humaneval run?")
    return found[-1]


def last_checkpoint(run: Path) -> Path:
    found = sorted(run.rglob("checkpoints/last.ckpt"))
    if not found:
        raise FileNotFoundError(f"{run} has no checkpoints/last.ckpt to score on HumanEval")
    return found[-1]


def baseline_eval(run: Path) -> Path:
    """The step-0 eval of a finished run, to reuse as other seeds' baseline."""
    start = eval_files(run).get(0)
    if start is None:
        raise FileNotFoundError(f"{run} has no eval/step_0.json: pass a run that evaluated at start "
                                "(the first seed of a benchmark run)")
    return start


def summarize(runs: list[tuple[int | str, Path]], baseline: Path | None,
              humaneval_baseline: Path | None = None) -> list[dict]:
    rows = []
    for seed, run in runs:
        files = eval_files(run)
        if not files:
            raise FileNotFoundError(f"{run} has no eval/step_*.json: did its MBPP eval run (eval.at_end)?")
        start = files.get(0) or baseline
        if start is None:
            raise FileNotFoundError(f"{run} has no step-0 eval and no baseline was given: run the first seed with "
                                    "eval.at_start true")
        last = max(files)
        before, after = scored_alike(start, files[last])
        rows.append({"seed": seed, "run": str(run), "steps": last, "training_minutes": training_minutes(run),
                     **compare(verdicts(before), verdicts(after))})
        scored = (run / "humaneval").is_dir() or any(run.rglob("eval/test_step_*.json"))
        if humaneval_baseline is not None and scored:
            # the trained seed's verdicts lie beside its checkpoint (before: under humaneval/): both are below run
            before, after = scored_alike(humaneval_baseline, humaneval_file(run))
            rows[-1]["humaneval"] = compare(verdicts(before), verdicts(after))
    return rows


def print_table(rows: list[dict], recipe: str, benchmark: str = "MBPP test") -> None:
    print(f"\nGreedy pass@1 on {benchmark} ({rows[0]['problems']} problems), recipe {recipe}")
    print("| seed | steps | before | after | change | pass -> fail | fail -> pass | McNemar p |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        change = row["passed_after"] - row["passed_before"]
        print(f"| {row['seed']} | {row['steps']} | {row['passed_before']} ({row['pass_at_1_before']:.1%}) "
              f"| {row['passed_after']} ({row['pass_at_1_after']:.1%}) | {change:+d} | {len(row['lost'])} "
              f"| {len(row['gained'])} | {row['mcnemar_p']:.3g} |")
    for row in rows:
        print(f"seed {row['seed']}: lost {row['lost']}, gained {row['gained']}")
    held_out = [{"seed": row["seed"], "steps": row["steps"], **row["humaneval"]} for row in rows if "humaneval" in row]
    if held_out:
        print_table(held_out, recipe, "HumanEval (held out)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, nargs="+", default=[REPO / "benchmarks" / "configs" / "learn_mbpp_cpu.yaml"],
                        help="the recipe: a config and optional overlays (rlcode fit --config ...)")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--root", type=Path, help="run directories go here (default: a new temp dir)")
    parser.add_argument("--baseline-every-seed", action="store_true",
                        help="evaluate the base model in every seed's run instead of reusing the first")
    parser.add_argument("--baseline", type=Path, help="a finished run whose step-0 eval every seed reuses: "
                        "no seed evaluates at start, so seeds can run as parallel invocations")
    parser.add_argument("--from-runs", type=Path, nargs="+", help="summarize these finished run directories")
    parser.add_argument("--no-humaneval", dest="humaneval", action="store_false",
                        help="skip scoring the base model and each seed's final checkpoint on HumanEval")
    parser.add_argument("--humaneval-baseline", type=Path, help="the base model's HumanEval verdicts "
                        "(eval/test_step_0.json of an earlier benchmark run), reused instead of scoring it again")
    parser.add_argument("--json", type=Path)
    parser.add_argument("fit_args", nargs=argparse.REMAINDER, help="after --: more rlcode fit arguments")
    args = parser.parse_args()
    extra = [a for a in args.fit_args if a != "--"]
    recipe = "+".join(config.stem for config in args.config)
    baseline = baseline_eval(args.baseline) if args.baseline else None
    humaneval_baseline = args.humaneval_baseline and base_model_verdicts(args.humaneval_baseline)

    failed: dict[int, str] = {}  # seed -> why its fit failed
    if args.from_runs:
        recipe = "as each run's name says"
        runs = [(run.name, run) for run in args.from_runs]
        baseline = baseline or next((files[0] for _, run in runs if 0 in (files := eval_files(run))), None)
        base_dirs = [run.parent / "humaneval-base" for _, run in runs if (run.parent / "humaneval-base").is_dir()]
        humaneval_baseline = humaneval_baseline or (humaneval_file(base_dirs[0]) if base_dirs else None)
        rows = summarize(runs, baseline, humaneval_baseline if args.humaneval else None)
    else:
        root = args.root or Path(tempfile.mkdtemp(prefix="learning-mbpp-"))
        if args.humaneval and humaneval_baseline is None:  # greedy: the same for every seed
            humaneval_baseline = humaneval_test(args.config, root / "humaneval-base", args.threads, None)
        runs, minutes = [], {}
        for seed in args.seeds:
            run = root / f"{recipe}-seed{seed}"
            minutes[seed], code = fit(args.config, seed, run, args.threads,
                                      baseline is None or args.baseline_every_seed, extra)
            if code:
                failed[seed] = f"rlcode fit exited {code}"
                print(f"learning_mbpp: seed {seed}: {failed[seed]}; reporting the verdicts it wrote, "
                      "without HumanEval (no trained checkpoint to score)", file=sys.stderr, flush=True)
            elif args.humaneval:
                humaneval_test(args.config, run / "humaneval", args.threads, last_checkpoint(run))
            files = eval_files(run)
            baseline = baseline or files.get(0)
            if seed not in failed or max(files, default=0) > 0:  # else it never scored a trained model
                runs.append((seed, run))
        rows = summarize(runs, baseline, humaneval_baseline if args.humaneval else None) if runs else []
        for row in rows:
            row["minutes"] = minutes[row["seed"]]
            if row["seed"] in failed:
                row["fit_failed"] = failed[row["seed"]]
    if rows:
        print_table(rows, recipe)
    line = {"benchmark": "learning_mbpp", "recipe": recipe, "load_avg_1m": os.getloadavg()[0], "results": rows}
    print(json.dumps(line))
    if args.json:
        args.json.write_text(json.dumps(line, indent=1))
    if failed:
        sys.exit(f"learning_mbpp: rlcode fit failed ({failed}); the rows above hold what those seeds wrote first")


if __name__ == "__main__":
    try:
        main()
    except (FileNotFoundError, ValueError) as error:  # bad run directories: one line, no traceback
        sys.exit(f"learning_mbpp: {error}")
