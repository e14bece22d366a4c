"""The code game against a competent fixed predictor (``configs/code_game_vs_model.yaml``): does the
writer learn programs that are hard for another model while keeping them valid?

1. ``skill``: the predictor's greedy accuracy on held-out CRUXEval-style cases from MBPP's test split
   (``code_game.py``'s cases: a task's reference solution, then ``print(<an assert's call>)``), each
   kept only if valid under the game's rule with the predictor's tokenizer and answer budget. It must
   be well above 0, or every valid program is already unpredictable and nothing can move.
2. ``runs``: per writer reward and seed, one ``rlcode fit`` of the recipe (its ``trainer.max_time``
   bounds it: 45 minutes). From the run's ``rollouts.jsonl`` (every game, its turns' verdicts): per
   step, the share of valid programs and the predictor's success on the valid ones; a PNG of both.
   The trend test, per run: the programs of the first 10 steps against those of the last 10, a
   two-sided permutation test of the difference in means (``PERMUTATIONS`` random relabellings from a
   fixed seed, so a results file recomputes) of each valid program's success share, and of each
   game's validity (1 valid, 0 not).
3. ``summarize ROOT``: the table, and three programs of the first step and three of the last with the
   predictor's answers (``--samples``), for the README.

    .venv/bin/python benchmarks/code_game_vs_model.py skill [--tasks 100] [--json out.json]
    .venv/bin/python benchmarks/code_game_vs_model.py writer-validity [--themes 8] [--per-theme 4]
    .venv/bin/python benchmarks/code_game_vs_model.py runs [--seeds 0 1 2] [--rewards learnability zero_sum]
        [ROOT] [-- rlcode fit arguments]       # one run after another, 2 threads each
    .venv/bin/python benchmarks/code_game_vs_model.py summarize ROOT [--json out.json] [--samples]

Results hold task ids, verdicts and the writer's own programs (never MBPP text).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import code_game as game_bench  # noqa: E402  (the held-out cases and greedy predictions)

from rlcode.data.mbpp import load_mbpp  # noqa: E402
from rlcode.envs.code_game import WRITER_PROMPT  # noqa: E402
from rlcode.models import load_model, load_tokenizer  # noqa: E402
from rlcode.rewards.extraction import extract_code  # noqa: E402
from rlcode.rollout.base import SamplingParams  # noqa: E402
from rlcode.rollout.hf_backend import HFGenerateBackend  # noqa: E402
from rlcode.rollout.rendering import render_prompt  # noqa: E402

CONFIG = REPO / "configs" / "code_game_vs_model.yaml"
PREDICTOR = "qwen2.5-coder-0.5b-instruct"  # the recipe's opponent_model
BUDGET = 48  # the recipe's opponent_max_new_tokens: the predictor's answer length and the output budget
WINDOW = 10  # steps at each end of a run for the trend test
PERMUTATIONS = 20_000


def skill(tasks: int, asserts: int = 1) -> dict:
    """The predictor's greedy held-out accuracy, with the cases' ids and verdicts."""
    started = time.perf_counter()
    tokenizer = load_tokenizer(PREDICTOR)
    cases = game_bench.heldout_cases(tokenizer, tasks, asserts, budget=BUDGET)
    model = load_model(PREDICTOR).eval()
    right = game_bench.predictions_right(model, tokenizer, [c["program"] for c in cases],
                                         [c["expected"] for c in cases], budget=BUDGET)
    return {"predictor": PREDICTOR, "budget_tokens": BUDGET, "tasks": tasks, "asserts": asserts,
            "cases": len(cases), "right": sum(right), "accuracy": sum(right) / max(len(cases), 1),
            "verdicts": {f"{c['task_id']}/{c['assert_index']}": r for c, r in zip(cases, right)},
            "minutes": round((time.perf_counter() - started) / 60, 1), "load_avg_1m": os.getloadavg()[0]}


def writer_validity(themes: int, per_theme: int, seed: int = 0) -> dict:
    """The starting writer's valid share: ``per_theme`` programs on each of the first ``themes`` MBPP
    train tasks (the themes training draws from), sampled as the recipe samples (T 0.8, 128 tokens),
    checked by the game's rule with the predictor's tokenizer and budget; the reasons counted."""
    tokenizer = load_tokenizer(game_bench.MODEL)
    prompts = [render_prompt(tokenizer, [{"role": "user", "content": WRITER_PROMPT.format(theme=task.text.strip())}],
                             chat=True) for task in load_mbpp(split="train")[:themes]]
    params = SamplingParams(temperature=0.8, max_new_tokens=128, stop=game_bench.STOP, seed=seed)
    texts = HFGenerateBackend(load_model(game_bench.MODEL).eval(), tokenizer).generate(prompts, per_theme, params)
    checks = game_bench.checked([extract_code(t) for t in texts.completion_texts], load_tokenizer(PREDICTOR),
                                budget=BUDGET)
    reasons = Counter(check.reason.split(" (")[0].split(":")[0] for check in checks if not check.valid)
    return {"programs": len(checks), "valid": sum(check.valid for check in checks), "reasons": dict(reasons.most_common())}


# ---- one run's curves and trend ----------------------------------------------------------------------
def games_by_step(run: Path) -> dict[int, list[dict]]:
    """Step -> its logged games (``rollouts.jsonl``: every game when samples_per_step covers them)."""
    steps: dict[int, list[dict]] = {}
    for line in next(run.rglob("rollouts.jsonl")).read_text().splitlines():
        game = json.loads(line)
        steps.setdefault(game["step"], []).append(game)
    return dict(sorted(steps.items()))


def program_outcomes(game: dict) -> tuple[bool, float | None]:
    """(the program was valid, the predictor's success share on it; None when invalid)."""
    writer, predictions = game["turns"][0], game["turns"][1:]
    if not writer.get("valid"):
        return False, None
    return True, sum(bool(p.get("correct")) for p in predictions) / max(len(predictions), 1)


def curve(steps: dict[int, list[dict]]) -> list[dict]:
    rows = []
    for step, games in steps.items():
        outcomes = [program_outcomes(g) for g in games]
        shares = [share for valid, share in outcomes if valid]
        rows.append({"step": step, "games": len(games), "valid_share": sum(v for v, _ in outcomes) / len(games),
                     "valid_programs": len(shares), "predictor_success": sum(shares) / len(shares) if shares else None})
    return rows


def permutation_p(first: list[float], last: list[float], permutations: int = PERMUTATIONS, seed: int = 0) -> float:
    """Two-sided p of the difference in means under random relabelling (counts the observed one)."""
    if not first or not last:
        return 1.0
    pooled, n = first + last, len(first)
    observed = abs(sum(last) / len(last) - sum(first) / n)
    rng, extreme = random.Random(seed), 0
    for _ in range(permutations):
        rng.shuffle(pooled)
        extreme += abs(sum(pooled[n:]) / len(last) - sum(pooled[:n]) / n) >= observed - 1e-12
    return (extreme + 1) / (permutations + 1)


def trend(steps: dict[int, list[dict]], window: int = WINDOW) -> dict:
    """The first ``window`` steps' programs against the last ``window``'s (fewer steps: halves): the
    predictor's success share on each valid program, each game's validity, and whether each valid
    program is learnable (some but not all predictions right: what ``learnability`` pays for)."""
    order = list(steps)
    window = min(window, len(order) // 2)
    ends = {"first": order[:window], "last": order[-window:] if window else []}
    stats = {}
    for end, chosen in ends.items():
        outcomes = [program_outcomes(g) for s in chosen for g in steps[s]]
        shares = [x for v, x in outcomes if v]
        stats[end] = {"validity": [float(v) for v, _ in outcomes], "success": shares,
                      "learnable": [float(0 < x < 1) for x in shares]}
    result = {"window_steps": window}
    for measure in ("success", "validity", "learnable"):
        first, last = stats["first"][measure], stats["last"][measure]
        result[measure] = {"first": sum(first) / len(first) if first else None, "n_first": len(first),
                           "last": sum(last) / len(last) if last else None, "n_last": len(last),
                           "permutation_p": permutation_p(first, last)}
    return result


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [r["step"] for r in rows]
    ax.plot(steps, [r["valid_share"] for r in rows], "o-", ms=3, label="valid programs (share of games)")
    ax.plot(steps, [float("nan") if r["predictor_success"] is None else r["predictor_success"] for r in rows],
            "s-", ms=3, label=f"{PREDICTOR}'s success on them")
    ax.set(xlabel="training step", ylim=(-0.05, 1.05))
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def samples(steps: dict[int, list[dict]], count: int = 3) -> dict:
    """``count`` valid programs of the first step that has them and of the last, with the answers."""
    def picked(order):
        for step in order:
            valid = [g for g in steps[step] if g["turns"][0].get("valid")]
            if valid:
                return {"step": step, "games": [{"program": g["turns"][0]["reply"], "output": g["turns"][0]["output"],
                                                 "answers": [t["reply"] for t in g["turns"][1:]],
                                                 "right": [bool(t.get("correct")) for t in g["turns"][1:]]}
                                                for g in valid[:count]]}
        return None
    return {"first": picked(list(steps)), "last": picked(list(reversed(steps)))}


def run_result(run: Path, reward: str, seed: int, minutes: float | None) -> dict:
    steps = games_by_step(run)
    rows = curve(steps)
    plot(rows, next(run.rglob("metrics.csv")).parent / "writer_curves.png", f"{reward}, seed {seed}, vs {PREDICTOR}")
    return {"reward": reward, "seed": seed, "steps": len(rows), "minutes": minutes, "curve": rows,
            "trend": trend(steps), "samples": samples(steps)}


# ---- running ----------------------------------------------------------------------------------------
def fit(reward: str, seed: int, root: Path, extra: list[str]) -> tuple[Path, float, int]:
    run = root / f"{reward}-seed{seed}"
    command = [sys.executable, "-m", "rlcode.cli", "fit", "--config", str(CONFIG), "--run.root_dir", str(run),
               "--data.seed", str(seed), "--model.generation_seed", str(seed),
               "--model.mode.init_args.writer_reward", reward, "--rollout_log.samples_per_step", "100000", *extra]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    started = time.perf_counter()
    code = subprocess.run(command, cwd=REPO).returncode
    return run, (time.perf_counter() - started) / 60, code


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("skill", "writer-validity", "runs", "summarize"))
    parser.add_argument("root", nargs="?", type=Path,
                        help="runs: where (default: a new temp dir); summarize: a finished root")
    parser.add_argument("--tasks", type=int, default=100, help="skill: MBPP test tasks (first assert of each)")
    parser.add_argument("--themes", type=int, default=8, help="writer-validity: MBPP train tasks as themes")
    parser.add_argument("--per-theme", type=int, default=4, help="writer-validity: programs per theme")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--rewards", nargs="+", default=["learnability", "zero_sum"])
    parser.add_argument("--samples", action="store_true", help="summarize: print the sample programs too")
    parser.add_argument("--json", type=Path)
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1:]
    if args.command == "writer-validity":
        report = writer_validity(args.themes, args.per_theme)
        print(f"writer: {report['valid']}/{report['programs']} valid; refused: {report['reasons']}")
    elif args.command == "skill":
        report = skill(args.tasks)
        print(f"{PREDICTOR}: {report['right']}/{report['cases']} held-out outputs right ({report['accuracy']:.1%}, "
              f"greedy, {BUDGET}-token budget), {report['minutes']} min")
    else:
        root = args.root or Path(tempfile.mkdtemp(prefix="code-game-vs-model-"))
        if args.command == "runs":
            for seed in args.seeds:
                for reward in args.rewards:
                    run, minutes, code = fit(reward, seed, root, extra)
                    if code != 0:  # its own error is above; there are no games to read
                        sys.exit(f"code_game_vs_model: the {reward} seed {seed} fit exited with {code} "
                                 f"(its error is printed above); fix it and rerun")
                    result = {**run_result(run, reward, seed, round(minutes, 1)), "exit_code": code}
                    (run / "result.json").write_text(json.dumps(result, indent=1))
        report = [json.loads(p.read_text()) for p in sorted(root.glob("*-seed*/result.json"))]
        print_table(report, args.samples)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


def print_table(results: list[dict], with_samples: bool) -> None:
    pct = game_bench.pct
    print("| reward | seed | steps | predictor success on valid, first -> last 10 steps (p) "
          "| valid share, first -> last (p) | learnable share of valid, first -> last (p) | run min |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        cells = []
        for measure in ("success", "validity", "learnable"):
            m = r["trend"].get(measure)  # results written before the learnable share have none
            cells.append(f"{pct(m['first'])} -> {pct(m['last'])} ({m['permutation_p']:.3g})" if m else "-")
        print(f"| {r['reward']} | {r['seed']} | {r['steps']} | {' | '.join(cells)} | {r['minutes']} |")
        for end in ("first", "last") if with_samples else ():
            picked = r["samples"][end]
            for item in (picked or {}).get("games", []):
                print(f"\n{end} (step {picked['step']}), output {item['output']!r}, right {item['right']}:\n"
                      f"{item['program']}\nanswers: {item['answers']}")


if __name__ == "__main__":
    main()
