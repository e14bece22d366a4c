"""Learning curve: does the quickstart setting raise the execution reward when run longer?

Runs ``rlcode fit`` (configs/quickstart.yaml by default) for ``--steps`` steps once per seed, each in
its own process, with the MBPP eval and checkpoints off and every completion logged to
rollouts.jsonl. Per seed it reports the mean execution reward (and the total reward the run
optimizes, and the fraction of MBPP tests passed) of the first ``--window`` steps vs the last
``--window`` steps, then the mean and spread (min..max, sample std) over seeds.

The first and last windows see different prompts, and MBPP tasks differ a lot in difficulty. So
there is also a matched comparison: the same tasks in the first epoch vs the last complete epoch
of the prompt stream (``data.num_train_tasks / data.prompts_per_step`` steps each), which needs at
least two epochs. The seed sets the sampling seed and ``seed_everything``; the prompt order
(``data.seed``) stays the same across seeds unless ``--vary-data-seed``.

    python benchmarks/learning_curve.py --steps 40 --seeds 0 1 2
    python benchmarks/learning_curve.py --steps 16 --seeds 0 1 --json lc.json
    python benchmarks/learning_curve.py --steps 6 --seeds 0 -- --config configs/tiny_test.yaml

Arguments after ``--`` go to ``rlcode fit`` as they are (config overlays, ``--model.x`` overrides).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# used when MBPP_DATASET_PATH is unset: the shared copy beside the repository
DEFAULT_MBPP = str(Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp" / "mbpp.jsonl")
QUIET = ["--eval.at_start", "false", "--eval.at_end", "false", "--eval.every_n_steps", "0",
         "--checkpoint.every_n_train_steps", "0", "--rollout_log.every_n_steps", "1",
         "--rollout_log.samples_per_step", "1000000"]


def fit_one_seed(seed: int, args: argparse.Namespace) -> Path:
    """``rlcode fit`` for one seed in a fresh process; returns its run directory."""
    experiment = f"learning_curve_seed{seed}"
    command = [sys.executable, "-m", "rlcode.cli", "fit", "--config", str(args.config), *args.overrides,
               "--trainer.max_steps", str(args.steps), "--seed_everything", str(seed),
               "--model.generation_seed", str(seed), "--run.root_dir", str(args.root),
               "--run.experiment", experiment, "--trainer.enable_progress_bar", "false", *QUIET]
    if args.vary_data_seed:
        command += ["--data.seed", str(seed)]
    env = {**os.environ, "MBPP_DATASET_PATH": os.environ.get("MBPP_DATASET_PATH", DEFAULT_MBPP)}
    if args.threads:  # torch reads it when it starts
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(args.threads)
    log = args.root / f"{experiment}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    if done.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise RuntimeError(f"seed {seed}: rlcode fit exited with {done.returncode} (log {log}):\n{tail}")
    runs = sorted((args.root / experiment).glob("version_*"), key=lambda p: int(p.name.split("_")[1]))
    print(f"  seed {seed}: {args.steps} steps in {time.perf_counter() - started:.0f} s ({runs[-1]})", file=sys.stderr)
    return runs[-1]


def _seed_of(run: Path, index: int) -> int:
    """The seed in a ``learning_curve_seed<N>/version_<n>`` path, else the run's position."""
    match = re.fullmatch(r"learning_curve_seed(\d+)", run.resolve().parent.name)
    return int(match.group(1)) if match else index


def step_table(run: Path) -> tuple[list[dict], int]:
    """Per training batch: task ids and mean rewards; and the steps in one epoch of the stream."""
    config = yaml.safe_load((run / "config.yaml").read_text())
    group, prompts = config["model"]["num_generations"], config["data"]["prompts_per_step"]
    tasks = config["data"]["num_train_tasks"]
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    per_batch = group * prompts
    if len(rows) % per_batch:
        raise ValueError(f"{run}/rollouts.jsonl has {len(rows)} rows, not a multiple of {per_batch} per batch")
    steps = []
    for start in range(0, len(rows), per_batch):
        batch = rows[start:start + per_batch]
        steps.append({
            "task_ids": sorted({row["task_id"] for row in batch}),
            "execution": _mean(row["rewards"].get("execution") for row in batch),
            "tests_fraction": _mean(row["rewards"].get("mbpp_tests_fraction") for row in batch),
            "total": _mean(row["reward"] for row in batch),
            "by_task": _by_task(batch),
        })
    steps_per_epoch = (tasks or 0) // prompts if tasks else 0
    return steps, steps_per_epoch


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _by_task(batch: list[dict]) -> dict[int, float]:
    totals: dict[int, list[float]] = {}
    for row in batch:
        if "execution" in row["rewards"]:
            totals.setdefault(row["task_id"], []).append(row["rewards"]["execution"])
    return {task: sum(v) / len(v) for task, v in totals.items()}


def seed_summary(steps: list[dict], steps_per_epoch: int, window: int) -> dict:
    first, last = steps[:window], steps[-window:]
    summary = {"batches": len(steps)}
    for key in ("execution", "total", "tests_fraction"):
        a, b = _mean(s[key] for s in first), _mean(s[key] for s in last)
        summary[f"{key}_first"], summary[f"{key}_last"] = a, b
        summary[f"{key}_delta"] = None if a is None or b is None else b - a
    epochs = len(steps) // steps_per_epoch if steps_per_epoch else 0
    if epochs >= 2:  # the same tasks, first epoch vs the last complete one
        early = _task_means(steps[:steps_per_epoch])
        late = _task_means(steps[(epochs - 1) * steps_per_epoch: epochs * steps_per_epoch])
        shared = sorted(set(early) & set(late))
        summary["matched_tasks"] = len(shared)
        summary["matched_first_epoch"] = _mean(early[t] for t in shared)
        summary["matched_last_epoch"] = _mean(late[t] for t in shared)
        summary["matched_delta"] = summary["matched_last_epoch"] - summary["matched_first_epoch"]
        summary["matched_epochs"] = [1, epochs]
    return summary


def _task_means(steps: list[dict]) -> dict[int, float]:
    values: dict[int, list[float]] = {}
    for step in steps:
        for task, value in step["by_task"].items():
            values.setdefault(task, []).append(value)
    return {task: sum(v) / len(v) for task, v in values.items()}


def spread(values: list[float | None]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {}
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def _fmt(value) -> str:
    return "   -  " if value is None else f"{value:+.3f}"


def print_table(per_seed: dict[int, dict], window: int) -> None:
    print(f"{'seed':<6}{'batches':>8}  {'exec first':>10}{'exec last':>10}{'delta':>8}  "
          f"{'total first':>11}{'total last':>11}  {'tests first':>11}{'tests last':>11}  {'matched epochs (exec)':>24}")
    for seed, s in per_seed.items():
        matched = (f"{_fmt(s['matched_first_epoch'])} -> {_fmt(s['matched_last_epoch'])}"
                   if "matched_delta" in s else "n/a (< 2 epochs)")
        print(f"{seed:<6}{s['batches']:>8}  {_fmt(s['execution_first']):>10}{_fmt(s['execution_last']):>10}"
              f"{_fmt(s['execution_delta']):>8}  {_fmt(s['total_first']):>11}{_fmt(s['total_last']):>11}  "
              f"{_fmt(s['tests_fraction_first']):>11}{_fmt(s['tests_fraction_last']):>11}  {matched:>24}")
    deltas = spread([s["execution_delta"] for s in per_seed.values()])
    if deltas:
        print(f"execution reward, last {window} - first {window} steps over {len(per_seed)} seed(s): "
              f"mean {deltas['mean']:+.3f}, min {deltas['min']:+.3f}, max {deltas['max']:+.3f}, std {deltas['std']:.3f}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--window", type=int, default=5, help="steps averaged at the start and at the end")
    parser.add_argument("--config", type=Path, default=REPO / "configs/quickstart.yaml")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "rlcode-learning-curve",
                        help="run directories go here (one experiment per seed)")
    parser.add_argument("--threads", type=int, help="torch threads of each run (default: torch's, one per core)")
    parser.add_argument("--vary-data-seed", action="store_true", help="also shuffle the prompts per seed")
    parser.add_argument("--json", type=Path, help="also write per-step values here")
    parser.add_argument("--from-runs", type=Path, nargs="+", help="summarize existing run directories, no training")
    args = parser.parse_args(argv)
    args.overrides = overrides
    if args.steps < 2 * args.window and not args.from_runs:
        parser.error(f"--steps {args.steps} is shorter than two windows of {args.window}: lower --window")

    if args.from_runs:
        runs = {_seed_of(run, index): run for index, run in enumerate(args.from_runs)}
    else:
        runs = {seed: fit_one_seed(seed, args) for seed in args.seeds}
    tables = {seed: step_table(run) for seed, run in runs.items()}
    per_seed = {seed: seed_summary(steps, per_epoch, args.window) for seed, (steps, per_epoch) in tables.items()}
    print_table(per_seed, args.window)
    steps = args.steps if not args.from_runs else max(s["batches"] for s in per_seed.values())
    line = {"benchmark": "learning_curve", "config": str(args.config), "overrides": overrides, "steps": steps,
            "window": args.window, "seeds": list(per_seed),
            "execution_first": spread([s["execution_first"] for s in per_seed.values()]),
            "execution_last": spread([s["execution_last"] for s in per_seed.values()]),
            "execution_delta": spread([s["execution_delta"] for s in per_seed.values()]),
            "matched_delta": spread([s.get("matched_delta") for s in per_seed.values()]),
            "per_seed": per_seed}
    print(json.dumps(line))
    if args.json:
        curves = {seed: [{k: v for k, v in s.items() if k != "by_task"} for s in steps]
                  for seed, (steps, _) in tables.items()}
        args.json.write_text(json.dumps({**line, "curves": curves, "runs": {k: str(v) for k, v in runs.items()}},
                                        indent=1))


if __name__ == "__main__":
    main()
