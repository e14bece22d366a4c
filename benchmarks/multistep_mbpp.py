"""Multi-step MBPP with the embedded SmolLM2-135M-Instruct on CPU: does feedback help, and does a
short multi-step run help?

1. Before training: greedy episodes of up to 3 attempts on MBPP validation problems; success at 1
   attempt vs within 3 (the same episodes: success at 1 is the single-attempt baseline).
2. After a short `rlcode fit --config configs/multistep_mbpp.yaml`: the same evaluation with the
   trained weights, and per measure (solved at the first attempt, within all attempts) the problems
   that flipped each way and McNemar's exact p on the same problems.

    .venv/bin/python benchmarks/multistep_mbpp.py [--problems 40] [--steps 6] [--threads 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # learning_mbpp's McNemar test
DEFAULT_MBPP = str(REPO.parent / "shared" / "data" / "mbpp" / "mbpp.jsonl")


def evaluate(checkpoint: Path | None, problems: int, attempts: int, batch: int) -> dict:
    import torch

    from rlcode.modes import MultiStepMBPP
    from rlcode.modes.multistep import attempt_metrics
    from rlcode.training.learner import Learner
    from rlcode.data.mbpp import load_mbpp
    from rlcode.envs.mbpp_feedback import MBPPFeedbackEnv
    from rlcode.envs.runner import EpisodeRunner
    from rlcode.sandbox import SandboxPool

    module = Learner(mode=MultiStepMBPP(), model_name="smollm2-135m-instruct", max_new_tokens=160, stop=["\n```\n"])
    module.configure_model()
    if checkpoint is not None:
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
        module.load_state_dict(state, strict=False)
    tasks = load_mbpp(os.environ.get("MBPP_DATASET_PATH", DEFAULT_MBPP), split="validation")[:problems]
    generate = lambda prompts, seed: module.generate(prompts, 1, temperature=0.0, seed=seed)  # noqa: E731
    episodes = []
    started = time.perf_counter()
    with SandboxPool(workers=2, timeout=10.0) as pool:
        for start in range(0, len(tasks), batch):
            envs = [MBPPFeedbackEnv(pool, task_id=t.task_id, text=t.text, tests=list(t.test_list),
                                    setup=t.test_setup_code, entry_point=t.entry_point, max_attempts=attempts,
                                    timeout=5.0) for t in tasks[start:start + batch]]
            episodes += EpisodeRunner(module.render, generate).play(envs, list(range(len(envs))), [(0,)] * len(envs))
    metrics = attempt_metrics(episodes, attempts)
    metrics["seconds"] = time.perf_counter() - started
    metrics["problems"] = len(tasks)
    metrics["solved_task_ids"] = [t.task_id for t, e in zip(tasks, episodes) if e.success]
    metrics["solved_first_task_ids"] = [t.task_id for t, e in zip(tasks, episodes) if e.success and len(e.turns) == 1]
    metrics["task_ids"] = [t.task_id for t in tasks]
    return metrics


def paired(before: dict, after: dict, key: str) -> dict:
    """Flips of one measure between two evaluations of the same problems, with McNemar's exact p."""
    from learning_mbpp import mcnemar_exact

    was, now = set(before[key]), set(after[key])
    lost, gained = sorted(was - now), sorted(now - was)
    return {"lost": lost, "gained": gained, "mcnemar_p": mcnemar_exact(len(lost), len(gained))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=40, help="first N MBPP validation problems")
    parser.add_argument("--attempts", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="episodes generated together")
    parser.add_argument("--steps", type=int, default=6, help="training steps of the multi-step run (0: none)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("MBPP_DATASET_PATH", DEFAULT_MBPP)
    import torch

    torch.set_num_threads(args.threads)
    report = {"before": evaluate(None, args.problems, args.attempts, args.batch)}
    print(json.dumps({"before": report["before"]}), flush=True)
    if args.steps:
        root = Path(tempfile.mkdtemp(prefix="multistep-"))
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rlcode.cli", "fit", "--config", str(REPO / "configs/multistep_mbpp.yaml"),
                        "--run.root_dir", str(root), "--trainer.max_steps", str(args.steps),
                        "--eval.at_start", "false", "--eval.at_end", "false", "--run.cpu_threads", str(args.threads)],
                       cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        report["train_minutes"] = (time.perf_counter() - started) / 60
        checkpoint = next(root.glob("*/version_*/checkpoints/last.ckpt"))
        report["after"] = evaluate(checkpoint, args.problems, args.attempts, args.batch)
    print(f"\nSmolLM2-135M-Instruct, {args.problems} MBPP validation problems, greedy, up to {args.attempts} attempts")
    print("| weights | success at 1 | success within 3 | mean attempts | fixed after a failed first | minutes |")
    print("|---|---|---|---|---|---|")
    for name in ("before", "after"):
        if name in report:
            m = report[name]
            print(f"| {name} | {m['multistep/success_at_1']:.3f} | {m[f'multistep/success_at_{args.attempts}']:.3f} | "
                  f"{m['multistep/mean_attempts']:.2f} | {m['multistep/fixed_rate']:.3f} | {m['seconds'] / 60:.1f} |")
    if "after" in report:
        for key, measure in (("solved_first_task_ids", "success at 1"), ("solved_task_ids", f"within {args.attempts}")):
            report[f"paired {measure}"] = flips = paired(report["before"], report["after"], key)
            print(f"{measure}: pass -> fail {flips['lost']}, fail -> pass {flips['gained']}, "
                  f"McNemar p {flips['mcnemar_p']:.3g}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
