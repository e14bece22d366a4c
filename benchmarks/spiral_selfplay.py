"""SPIRAL self-play with the embedded SmolLM2-135M-Instruct on TicTacToe, on CPU.

Two measurements, printed as tables (and as JSON with --json):

1. Runner throughput: the same self-play episodes played by the episode runner with every live
   episode's turn in one generation call ("batched") against one episode at a time ("sequential"),
   same model, sampling settings and deals: episodes/s, generated tokens/s, generation calls.
2. Learning: per seed, games against a random legal mover (win / draw / loss / invalid-move rates,
   the policy in both seats, greedy) before and after a short `rlcode fit` of
   configs/spiral_tictactoe.yaml, read from the run's metrics.csv.

    .venv/bin/python benchmarks/spiral_selfplay.py [--episodes 8] [--steps 5] [--seeds 0 1 2] [--threads 1]
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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RATES = ("win_rate", "draw_rate", "loss_rate", "invalid_move_rate")
GAME = "TicTacToe-v0"


def runner_throughput(episodes: int, max_new_tokens: int) -> dict:
    from rlcode.envs.runner import EpisodeRunner
    from rlcode.modes import SPIRAL
    from rlcode.training.learner import Learner

    module = Learner(mode=SPIRAL(move_format="bracket", max_turns=9), model_name="smollm2-135m-instruct",
                     max_new_tokens=max_new_tokens, temperature=1.0)
    module.configure_model()
    tokens = [0]

    def generate(prompts, seed):
        rollout = module.generate(prompts, 1, temperature=1.0, seed=seed)
        tokens[0] += int(rollout.completion_mask.sum())
        return rollout

    results = {}
    for mode in ("batched", "sequential"):
        tokens[0] = 0
        runner = EpisodeRunner(module.render, generate)
        started = time.perf_counter()
        if mode == "batched":
            played = runner.play([module.mode.make_game(GAME) for _ in range(episodes)], list(range(episodes)),
                                 [(0, 1)] * episodes, sampling_seed=1)
        else:
            played = [e for i in range(episodes)
                      for e in runner.play([module.mode.make_game(GAME)], [i], [(0, 1)], sampling_seed=1 + i)]
        seconds = time.perf_counter() - started
        results[mode] = {"episodes": len(played), "seconds": seconds, "episodes_per_s": len(played) / seconds,
                         "tokens_per_s": tokens[0] / seconds, "generation_calls": runner.backend_calls,
                         "turns": sum(len(e.turns) for e in played)}
    results["speedup"] = results["batched"]["episodes_per_s"] / results["sequential"]["episodes_per_s"]
    return results


def learning_run(seed: int, steps: int, eval_episodes: int, threads: int) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"spiral-seed{seed}-"))
    command = [sys.executable, "-m", "rlcode.cli", "fit", "--config", str(REPO / "configs/spiral_tictactoe.yaml"),
               "--run.root_dir", str(root), "--trainer.max_steps", str(steps), "--data.seed", str(seed),
               "--model.generation_seed", str(seed), "--data.eval_episodes", str(eval_episodes),
               "--run.cpu_threads", str(threads)]
    started = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    metrics = next(root.glob("*/version_*/metrics.csv"))
    with metrics.open() as handle:
        evals = [row for row in csv.DictReader(handle) if row.get(f"spiral/{GAME}/win_rate")]
    before, after = evals[0], evals[-1]
    return {"seed": seed, "steps": steps, "minutes": (time.perf_counter() - started) / 60,
            "before": {rate: float(before[f"spiral/{GAME}/{rate}"]) for rate in RATES},
            "after": {rate: float(after[f"spiral/{GAME}/{rate}"]) for rate in RATES}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=8, help="episodes of the throughput comparison")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--steps", type=int, default=5, help="training steps per seed")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--eval-episodes", type=int, default=8, help="games per seat in each evaluation")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-learning", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    torch.set_num_threads(args.threads)
    report = {}
    if not args.skip_throughput:
        report["throughput"] = throughput = runner_throughput(args.episodes, args.max_new_tokens)
        print(f"\nRunner, {args.episodes} self-play TicTacToe episodes, SmolLM2-135M, {args.threads} thread(s)")
        print("| mode | episodes/s | tokens/s | generation calls | turns | seconds |\n|---|---|---|---|---|---|")
        for mode in ("batched", "sequential"):
            row = throughput[mode]
            print(f"| {mode} | {row['episodes_per_s']:.3f} | {row['tokens_per_s']:.1f} | {row['generation_calls']} "
                  f"| {row['turns']} | {row['seconds']:.1f} |")
        print(f"batched / sequential episodes/s: {throughput['speedup']:.2f}x")
    report["learning"] = runs = []
    for seed in [] if args.skip_learning else args.seeds:
        runs.append(learning_run(seed, args.steps, args.eval_episodes, args.threads))
        print(json.dumps(runs[-1]), flush=True)
    if runs:
        print(f"\nGames against a random legal mover ({2 * args.eval_episodes} per eval, both seats, greedy), "
              f"before -> after {args.steps} steps")
        print("| seed | win | draw | loss | invalid move | minutes |\n|---|---|---|---|---|---|")
        for run in runs:
            cells = " | ".join(f"{run['before'][r]:.2f} -> {run['after'][r]:.2f}" for r in RATES)
            print(f"| {run['seed']} | {cells} | {run['minutes']:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
