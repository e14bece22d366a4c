"""The training pass with shared prefixes against the same pass without (the named peer), SmolLM2.

``share_prefix`` runs the packed pass (``rlcode.logprobs.packed_pass``: one decoder call per
micro-batch); before 2026-11-29 it ran one call per prompt-tree level on past caches. The JSON's
``shared_pass`` says which a result measured ("packed" or "tree_levels").

One step's rows are sampled once and saved; then each side runs the policy's training pass over
them (``completion_logps`` forward + backward of a fixed weighting of the log-probs, micro-batches
as the config's, no optimizer step) in a fresh interpreter, so its peak RSS is its own. Settings:

  grpo    4 MBPP train prompts (chat template, ~200 tokens) x G = 4 completions of <= 64 tokens,
          T = 1.0, micro-batches of 4 (the step-throughput benchmark's rows)
  spiral  8 self-play TicTacToe games (configs/spiral_tictactoe.yaml: bracket moves, <= 24 tokens,
          T = 1.0), every turn a row, micro-batches of 8: the turns share the game's rules

Per side: completion tokens trained per second (best pass of ``--passes`` after a warm-up),
prompt tokens the decoder ran per pass, peak RSS; and that both sides' log-probs and gradients agree.

    .venv/bin/python benchmarks/shared_prefix_pass.py [--setting grpo spiral] [--passes 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from run_record import emit, run_record

HERE = Path(__file__).resolve().parent
RESULT = "SHARED_PREFIX_RESULT "
MODEL = "smollm2-135m-instruct"
MICRO_BATCH = {"grpo": 4, "spiral": 8}


def sample_rows(setting: str, path: Path, model: str) -> None:
    """One step's rows of ``setting`` (token tensors) -> ``path``."""
    import torch

    if setting == "grpo":
        from grpo_sides import prompt_rows

        from rlcode.modes import GRPO
        from rlcode.training.learner import Learner

        module = Learner(mode=GRPO(num_generations=4), model_name=model, max_new_tokens=64, temperature=1.0)
        module.configure_model()
        prompts = [module.render(row["prompt"]) for row in prompt_rows(4)]
        rollout = module.generate(prompts, 4, temperature=1.0, seed=0)
    else:
        from rlcode.modes import SPIRAL
        from rlcode.training.learner import Learner

        module = Learner(mode=SPIRAL(opponent="self", move_format="bracket", max_turns=9), model_name=model,
                         max_new_tokens=24, temperature=1.0)
        module.configure_model()
        turns = module.mode.collect(module, {"game": ["TicTacToe-v0"] * 8, "seed": list(range(8)), "step": 0})
        rollout = turns.rollout
    torch.save({name: getattr(rollout, name).cpu() for name in
                ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}, path)


def run_side(share: bool, rows_path: Path, micro_batch: int, passes: int, model: str) -> dict:
    """Forward + backward over the saved rows, ``passes`` times after a warm-up; best pass time."""
    import torch

    from rlcode.logprobs.sequence_logps import completion_logps
    from rlcode.models import disable_dropout, load_model

    rows = torch.load(rows_path)
    policy = load_model(model)
    disable_dropout(policy)
    policy.train()
    positions = [0]

    def count(module, args, kwargs):
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        padded = mask is not None and mask.dim() == 2  # the packed pass's 4-D mask runs no padding
        positions[0] += int(mask[:, -ids.size(1):].sum()) if padded else ids.numel()

    policy.get_decoder().register_forward_pre_hook(count, with_kwargs=True)
    weights = torch.randn(rows["completion_ids"].shape, generator=torch.Generator().manual_seed(0))
    times, logps = [], None
    for repeat in range(passes + 1):
        policy.zero_grad(set_to_none=True)
        positions[0] = 0
        parts = []
        started = time.perf_counter()
        for start in range(0, rows["completion_ids"].size(0), micro_batch):
            part = slice(start, start + micro_batch)
            row_logps = completion_logps(policy, rows["prompt_ids"][part], rows["prompt_mask"][part],
                                         rows["completion_ids"][part], rows["completion_mask"][part], 1.0,
                                         share_prefix=share)
            (row_logps * weights[part]).sum().backward()
            parts.append(row_logps.detach())
        if repeat:
            times.append(time.perf_counter() - started)
        logps = torch.cat(parts)
    gradient = torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])
    completion_tokens = int(rows["completion_mask"].sum())
    return {"share_prefix": share, "seconds": min(times), "all_seconds": times,
            "completion_tokens": completion_tokens, "tokens_per_s": completion_tokens / min(times),
            "decoder_tokens": positions[0], "prompt_tokens": positions[0] - completion_tokens,
            "rows": int(rows["completion_ids"].size(0)),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "logps": logps.tolist(), "gradient_norm": float(gradient.norm()),
            "gradient_sample": gradient[:: max(1, gradient.numel() // 4096)].tolist()}


def child(command: list[str], threads: int, timeout: float) -> dict | None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(Path(__file__).resolve()), *command], capture_output=True, text=True,
                          env=env, cwd=HERE.parent, timeout=timeout)
    if done.returncode:
        raise RuntimeError(f"{command[:2]} exited with {done.returncode}:\n" + "\n".join(done.stderr.splitlines()[-20:]))
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return None


def agreement(a: dict, b: dict) -> dict:
    import torch

    logps = float((torch.tensor(a["logps"]) - torch.tensor(b["logps"])).abs().max())
    ga, gb = torch.tensor(a["gradient_sample"]), torch.tensor(b["gradient_sample"])
    return {"max_logp_difference": logps,
            "max_gradient_difference_relative": float((ga - gb).abs().max() / gb.abs().max().clamp(min=1e-12)),
            "gradient_norm_ratio": a["gradient_norm"] / b["gradient_norm"]}


def _shared_pass() -> str:
    """Which implementation ``share_prefix`` ran: the packed single call, or the older per-tree-level calls."""
    return "packed" if (HERE.parent / "rlcode" / "logprobs" / "packed_pass.py").exists() else "tree_levels"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", nargs="+", default=["grpo", "spiral"], choices=["grpo", "spiral"])
    parser.add_argument("--passes", type=int, default=3, help="timed passes per side after one warm-up")
    parser.add_argument("--repeats", type=int, default=1, help="side runs, alternating; each side's best is kept")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=MODEL, help="tiny-random: a quick check of the script")
    parser.add_argument("--timeout", type=float, default=3600.0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--sample", nargs=2, help=argparse.SUPPRESS)  # child: setting, rows path
    parser.add_argument("--side", nargs=4, help=argparse.SUPPRESS)  # child: share, rows, micro-batch, passes
    args = parser.parse_args()
    if args.sample or args.side:
        import torch

        torch.set_num_threads(args.threads)
        if args.sample:
            sample_rows(args.sample[0], Path(args.sample[1]), args.model)
        else:
            share, rows, micro_batch, passes = args.side
            print(RESULT + json.dumps(run_side(share == "1", Path(rows), int(micro_batch), int(passes), args.model)), flush=True)
        return

    report = []
    for setting in args.setting:
        rows = Path(tempfile.mkdtemp(prefix="shared-prefix-")) / f"{setting}.pt"
        child(["--sample", setting, str(rows), "--threads", str(args.threads), "--model", args.model], args.threads, args.timeout)
        best: dict[bool, dict] = {}
        for repeat in range(args.repeats):
            for share in ((True, False) if repeat % 2 == 0 else (False, True)):
                result = child(["--side", "1" if share else "0", str(rows), str(MICRO_BATCH[setting]), str(args.passes),
                                "--threads", str(args.threads), "--model", args.model], args.threads, args.timeout)
                print(f"  [{setting}] share={share}: {result['tokens_per_s']:.1f} tokens/s "
                      f"({result['all_seconds']}), {result['peak_rss_mb']:.0f} MB", file=sys.stderr)
                if share not in best or result["tokens_per_s"] > best[share]["tokens_per_s"]:
                    best[share] = result
        shared, plain = best[True], best[False]
        report.append({"setting": setting, "rows": shared["rows"], "micro_batch": MICRO_BATCH[setting],
                       **{side: {k: v for k, v in result.items() if k not in ("logps", "gradient_sample")}
                          for side, result in (("shared", shared), ("plain", plain))},
                       "tokens_per_s_ratio": shared["tokens_per_s"] / plain["tokens_per_s"],
                       "peak_rss_ratio": shared["peak_rss_mb"] / plain["peak_rss_mb"],
                       "agreement": agreement(shared, plain)})
    print(f"\nTraining pass (forward + backward), {args.model}, fp32, {args.threads} thread(s), best of {args.passes}")
    print("| setting | rows | side | prompt tokens run | completion tokens | s/pass | tokens/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    for row in report:
        for side in ("shared", "plain"):
            s = row[side]
            print(f"| {row['setting']} | {row['rows']} | {side} | {s['prompt_tokens']} | {s['completion_tokens']} "
                  f"| {s['seconds']:.2f} | {s['tokens_per_s']:.1f} | {s['peak_rss_mb']:.0f} |")
        agree = row["agreement"]
        print(f"{row['setting']}: shared / plain tokens/s {row['tokens_per_s_ratio']:.2f}x, peak RSS "
              f"{row['peak_rss_ratio']:.2f}x; max |logp difference| {agree['max_logp_difference']:.2g}, "
              f"max relative gradient difference {agree['max_gradient_difference_relative']:.2g}")
    line = {"benchmark": "shared_prefix_pass", "model": args.model, "passes": args.passes,
            "shared_pass": _shared_pass(), **run_record(args.threads), "results": report}
    emit(line, args.json)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
