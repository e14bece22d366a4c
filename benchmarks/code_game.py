"""Does the code game teach anything? The predictor's held-out skill and the writer's programs, before
and after CPU code-game runs, for ``writer_reward`` zero_sum and learnability, per seed.

1. Held-out predictor skill (programs nobody here wrote): CRUXEval-style output prediction on MBPP's
   test split (``rlcode.data.output_prediction``: a task's reference solution, then
   ``print(<an assert's call>)``). Each case runs through the code game's validity rule with the
   predictor's tokenizer and budget (``check_program``; the sandbox, concurrently); the valid ones are
   the held-out set and their output is the expected answer. The predictor answers greedily with the
   game's predictor prompt; accuracy of the starting model, and of each run's last weights, with
   McNemar's exact paired p on the same cases.
2. The writer: per training step, the share of valid programs (the run's metrics) and the accuracy
   of the FROZEN starting predictor (greedy) on that step's valid programs (read from the run's
   ``rollouts.jsonl``, every game logged, re-checked for their outputs). Rising difficulty with
   validity kept is what the game is for. A PNG of both curves goes into each run's directory.

Written results hold task ids, assert indices and verdicts only (never MBPP text).

    .venv/bin/python benchmarks/code_game.py [--seeds 0 1 2] [--rewards zero_sum learnability] [--steps 8]
        [--tasks 150] [--asserts 1] [--parallel 2] [--root DIR] [--json out.json] [-- rlcode fit arguments]
    full size: --tasks 500 --asserts 3 (about 1,500 cases before the validity rule) --steps 50
    .venv/bin/python benchmarks/code_game.py --summarize ROOT   # the table of a finished root
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from learning_mbpp import mcnemar_exact  # noqa: E402

from rlcode.data.mbpp import load_mbpp  # noqa: E402
from rlcode.data.output_prediction import prediction_cases  # noqa: E402
from rlcode.envs.code_game import PREDICTOR_PROMPT, extract_prediction, start_check  # noqa: E402
from rlcode.cli.export import read_checkpoint, restore_module  # noqa: E402
from rlcode.models import load_model, load_tokenizer  # noqa: E402
from rlcode.rewards.extraction import extract_code  # noqa: E402
from rlcode.rollout.base import SamplingParams  # noqa: E402
from rlcode.rollout.hf_backend import HFGenerateBackend  # noqa: E402
from rlcode.rollout.rendering import render_prompt  # noqa: E402
from rlcode.sandbox import SandboxPool  # noqa: E402

MODEL = "smollm2-135m-instruct"
CONFIG = REPO / "configs" / "code_game.yaml"
MAX_NEW_TOKENS = 128  # configs/code_game.yaml's: the predictor's budget in the game and here
STOP = ["\n```\n"]


def checked(programs: list[str], tokenizer, timeout: float = 5.0, workers: int = 2,
            budget: int = MAX_NEW_TOKENS) -> list:
    """``ProgramCheck`` of each program under the game's rule (the predictor's tokenizer and budget)."""
    with SandboxPool(workers=workers, timeout=2 * timeout + 5) as pool:
        waits = [start_check(p, timeout, pool=pool, tokenizer=tokenizer, max_output_tokens=budget)
                 for p in programs]
        return [wait() for wait in waits]


def heldout_cases(tokenizer, tasks: int, asserts: int, budget: int = MAX_NEW_TOKENS) -> list[dict]:
    """The valid held-out cases: the first ``asserts`` asserts of the first ``tasks`` MBPP test tasks."""
    cases = [c for c in prediction_cases(load_mbpp(split="test")[:tasks]) if c.assert_index < asserts]
    checks = checked([c.program for c in cases], tokenizer, budget=budget)
    return [{"task_id": c.task_id, "assert_index": c.assert_index, "program": c.program, "expected": check.output}
            for c, check in zip(cases, checks) if check.valid]


def predictions_right(model, tokenizer, programs: list[str], expected: list[str], batch: int = 16,
                      budget: int = MAX_NEW_TOKENS) -> list[bool]:
    """Greedy predictions with the game's predictor prompt, compared as the game compares them."""
    backend = HFGenerateBackend(model, tokenizer)
    params = SamplingParams(temperature=0.0, max_new_tokens=budget, stop=STOP)
    right = []
    for start in range(0, len(programs), batch):
        prompts = [render_prompt(tokenizer, [{"role": "user", "content": PREDICTOR_PROMPT.format(program=p.strip())}],
                                 chat=True) for p in programs[start:start + batch]]
        texts = backend.generate(prompts, 1, params).completion_texts
        right += [extract_prediction(t) == e for t, e in zip(texts, expected[start:start + batch])]
    return right


def model_at(checkpoint: Path | None):
    """The starting model, or a code-game run's trained policy (as ``rlcode export`` restores it)."""
    if checkpoint is None:
        return load_model(MODEL).eval()
    return restore_module(read_checkpoint(checkpoint), checkpoint).policy


def heldout_verdicts(model, tokenizer, cases: list[dict]) -> dict[str, bool]:
    right = predictions_right(model, tokenizer, [c["program"] for c in cases], [c["expected"] for c in cases])
    return {f"{c['task_id']}/{c['assert_index']}": r for c, r in zip(cases, right)}


def writer_curve(run: Path, model, tokenizer) -> list[dict]:
    """Per step: games, valid share (the run's metric), and the frozen predictor's accuracy on the
    step's valid programs (re-checked for their outputs)."""
    metrics = {}
    with next(run.rglob("metrics.csv")).open() as handle:
        for row in csv.DictReader(handle):
            if row.get("code_game/valid_program_rate"):
                metrics[int(float(row["step"]))] = row
    games = [json.loads(line) for line in next(run.rglob("rollouts.jsonl")).read_text().splitlines()]
    programs = [(g["step"], extract_code(g["turns"][0]["reply"])) for g in games]
    checks = checked([p for _, p in programs], tokenizer)
    valid = [(step, p, c.output) for (step, p), c in zip(programs, checks) if c.valid]
    right = predictions_right(model, tokenizer, [p for _, p, _ in valid], [o for _, _, o in valid]) if valid else []
    curve = []
    for step in sorted({s for s, _ in programs}):
        mine = [r for (s, _, _), r in zip(valid, right) if s == step]
        row = metrics.get(step, {})
        curve.append({"step": step, "games": sum(s == step for s, _ in programs),
                      "valid_share": float(row.get("code_game/valid_program_rate", "nan")),
                      "valid_rechecked": len(mine), "frozen_right": sum(mine),
                      "frozen_accuracy": sum(mine) / len(mine) if mine else None,
                      "learnable_rate": float(row.get("code_game/learnable_program_rate", "nan")),
                      "writer_mean_return": float(row.get("code_game/writer_mean_return", "nan"))})
    return curve


def plot(curve: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in curve]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r["valid_share"] for r in curve], "o-", label="valid programs (share of games)")
    ax.plot(steps, [r["frozen_accuracy"] if r["frozen_accuracy"] is not None else float("nan") for r in curve],
            "s-", label="frozen starting predictor accuracy on them")
    ax.set_xlabel("training step")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def job(kind: str, reward: str, seed: int, root: Path, steps: int, k: int, extra: list[str]) -> None:
    """One unit of work, in its own process (``--job``): the baseline eval, or a run and its evals."""
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(MODEL)
    cases = json.loads((root / "cases.json").read_text())
    started = time.perf_counter()
    if kind == "baseline":
        result = {"heldout": heldout_verdicts(model_at(None), tokenizer, cases)}
        (root / "baseline.json").write_text(json.dumps({**result, "minutes": (time.perf_counter() - started) / 60}))
        return
    run = root / f"{reward}-seed{seed}"
    command = [sys.executable, "-m", "rlcode.cli", "fit", "--config", str(CONFIG), "--run.root_dir", str(run),
               "--run.cpu_threads", "1", "--trainer.max_steps", str(steps), "--data.seed", str(seed),
               "--model.generation_seed", str(seed), "--model.mode.init_args.writer_reward", reward,
               "--model.mode.init_args.predictions_per_program", str(k), "--rollout_log.samples_per_step", "100000",
               "--eval.at_start", "false", "--eval.at_end", "false", *extra]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, cwd=REPO, check=True)
    fit_minutes = (time.perf_counter() - started) / 60
    after = heldout_verdicts(model_at(next(run.rglob("checkpoints/last.ckpt"))), tokenizer, cases)
    curve = writer_curve(run, model_at(None), tokenizer)
    plot(curve, next(run.rglob("metrics.csv")).parent / "writer_curves.png", f"{reward}, K={k}, seed {seed}")
    (run / "result.json").write_text(json.dumps({
        "reward": reward, "seed": seed, "steps": steps, "k": k, "heldout_after": after, "curve": curve,
        "fit_minutes": fit_minutes, "minutes": (time.perf_counter() - started) / 60}))


def summarize(root: Path) -> list[dict]:
    before = json.loads((root / "baseline.json").read_text())["heldout"]
    rows = []
    for path in sorted(root.glob("*-seed*/result.json")):
        result = json.loads(path.read_text())
        after = result["heldout_after"]
        lost = sorted(c for c in before if before[c] and not after[c])
        gained = sorted(c for c in before if after[c] and not before[c])
        curve = result["curve"]
        half = max(len(curve) // 2, 1)

        def mean(rows_, key):
            values = [r[key] for r in rows_ if r[key] is not None and r[key] == r[key]]
            return sum(values) / len(values) if values else None

        def frozen(rows_):
            valid = sum(r["valid_rechecked"] for r in rows_)
            return sum(r["frozen_right"] for r in rows_) / valid if valid else None

        rows.append({"reward": result["reward"], "seed": result["seed"], "steps": result["steps"], "k": result["k"],
                     "cases": len(before), "right_before": sum(before.values()), "right_after": sum(after.values()),
                     "lost": len(lost), "gained": len(gained), "mcnemar_p": mcnemar_exact(len(lost), len(gained)),
                     "valid_first_half": mean(curve[:half], "valid_share"),
                     "valid_second_half": mean(curve[half:], "valid_share"),
                     "frozen_first_half": frozen(curve[:half]), "frozen_second_half": frozen(curve[half:]),
                     "valid_programs": sum(r["valid_rechecked"] for r in curve),
                     "fit_minutes": result["fit_minutes"], "minutes": result["minutes"]})
    return rows


def pct(value) -> str:
    return "-" if value is None else f"{value:.0%}"


def print_table(rows: list[dict]) -> None:
    print("| reward | seed | held-out right before -> after | lost/gained | McNemar p | valid share (1st -> 2nd half) "
          "| frozen acc. on valid programs (1st -> 2nd half) | valid programs | run min |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['reward']} (K={r['k']}) | {r['seed']} | {r['right_before']}/{r['cases']} -> {r['right_after']}"
              f"/{r['cases']} | {r['lost']}/{r['gained']} | {r['mcnemar_p']:.3g} | {pct(r['valid_first_half'])} -> "
              f"{pct(r['valid_second_half'])} | {pct(r['frozen_first_half'])} -> {pct(r['frozen_second_half'])} "
              f"| {r['valid_programs']} | {r['minutes']:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--rewards", nargs="*", default=["zero_sum", "learnability"])
    parser.add_argument("--steps", type=int, default=8, help="training steps per run (configs/code_game.yaml's)")
    parser.add_argument("--k", type=int, default=2, help="predictions_per_program, the same for both rewards")
    parser.add_argument("--tasks", type=int, default=150, help="MBPP test tasks for the held-out cases (500: all)")
    parser.add_argument("--asserts", type=int, default=1, help="asserts per task (3: all, ~1,500 cases)")
    parser.add_argument("--parallel", type=int, default=2, help="jobs at once, 1 CPU thread each")
    parser.add_argument("--root", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--summarize", type=Path, help="print the table of a finished root")
    parser.add_argument("--job", nargs=3, metavar=("KIND", "REWARD", "SEED"), help=argparse.SUPPRESS)
    parser.add_argument("fit_args", nargs=argparse.REMAINDER, help="after --: more rlcode fit arguments")
    args = parser.parse_args()
    extra = [a for a in args.fit_args if a != "--"]
    if args.job:
        return job(args.job[0], args.job[1], int(args.job[2]), args.root, args.steps, args.k, extra)
    if args.summarize:
        rows = summarize(args.summarize)
    else:
        root = args.root or Path(tempfile.mkdtemp(prefix="code-game-"))
        root.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        torch.set_num_threads(1)
        cases = heldout_cases(load_tokenizer(MODEL), args.tasks, args.asserts)
        (root / "cases.json").write_text(json.dumps(cases))  # the runs' private copy, in the run root only
        print(f"{len(cases)} valid held-out cases ({(time.perf_counter() - started) / 60:.1f} min)", flush=True)
        jobs = [("baseline", "-", 0)] + [("run", reward, seed) for seed in args.seeds for reward in args.rewards]

        def launch(spec):
            command = [sys.executable, __file__, "--job", spec[0], spec[1], str(spec[2]), "--root", str(root),
                       "--steps", str(args.steps), "--k", str(args.k), "--", *extra]
            with (root / f"{spec[0]}-{spec[1]}-{spec[2]}.log").open("w") as log:
                return subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode

        with ThreadPoolExecutor(args.parallel) as pool:
            codes = list(pool.map(launch, jobs))
        print(f"jobs' exit codes {codes}; {(time.perf_counter() - started) / 60:.1f} min in all, load average "
              f"{os.getloadavg()}, root {root}", flush=True)
        rows = summarize(root)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
