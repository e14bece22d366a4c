"""bitsandbytes' 8-bit AdamW against torch's AdamW (the named peer) on the same GRPO rows, SmolLM2, CPU.

Not a learning run on MBPP (two recipe runs of ~35 minutes each did not fit the session that added
the option): one step's rows are sampled once (``shared_prefix_pass.py``'s GRPO setting: 4 MBPP train
prompts x 4 completions) and given fixed advantages (+1 / -1 by a seeded draw); each optimizer then
takes ``--updates`` steps of the policy-gradient loss -mean(A * log p) on them from the same start, in
a fresh interpreter. Reported per side: the objective mean(A * log p) before each update (what the
updates raise), seconds per update, optimizer state bytes and peak RSS; and the cosine between the two
sides' total weight change, with their norms.

    .venv/bin/python benchmarks/optimizer_8bit.py [--updates 8] [--lr 1e-5] [--threads 1] [--json OUT]
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
RESULT = "OPTIMIZER_8BIT_RESULT "
SIDES = ("adamw", "adamw_8bit")


def run_side(name: str, rows_path: Path, updates: int, lr: float, model: str, delta_path: Path) -> dict:
    import torch

    from rlcode.logprobs.sequence_logps import completion_logps
    from rlcode.models import disable_dropout, load_model
    from rlcode.training.optimizers import build_optimizer

    rows = torch.load(rows_path)
    policy = load_model(model)
    disable_dropout(policy)
    policy.train()
    start = {n: p.detach().clone() for n, p in policy.named_parameters()}
    optimizer = build_optimizer(name, [p for p in policy.parameters() if p.requires_grad], lr=lr, weight_decay=0.0,
                                sharded=False)
    mask = rows["completion_mask"].float()
    advantages = torch.where(torch.rand(mask.size(0), generator=torch.Generator().manual_seed(0)) < 0.5, 1.0, -1.0)
    objective, seconds = [], []
    for _ in range(updates):
        started = time.perf_counter()
        logps = completion_logps(policy, rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"],
                                 rows["completion_mask"], 1.0, share_prefix=True)
        value = (advantages.unsqueeze(1) * logps * mask).sum() / mask.sum()
        (-value).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds.append(time.perf_counter() - started)
        objective.append(float(value))
    with torch.no_grad():
        logps = completion_logps(policy, rows["prompt_ids"], rows["prompt_mask"], rows["completion_ids"],
                                 rows["completion_mask"], 1.0, share_prefix=True)
        objective.append(float((advantages.unsqueeze(1) * logps * mask).sum() / mask.sum()))
    state_bytes = sum(value.numel() * value.element_size() for state in optimizer.state.values()
                      for value in state.values() if torch.is_tensor(value))
    delta = torch.cat([(p.detach() - start[n]).flatten() for n, p in policy.named_parameters()])
    torch.save(delta, delta_path)
    return {"optimizer": name, "objective": objective, "gain": objective[-1] - objective[0],
            "seconds_per_update": sorted(seconds)[len(seconds) // 2], "optimizer_state_bytes": state_bytes,
            "trained_parameters": sum(p.numel() for p in policy.parameters() if p.requires_grad),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tiny-random: a quick check of the script")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--side", nargs=3, help=argparse.SUPPRESS)  # child: optimizer, rows, delta path
    args = parser.parse_args()
    if args.side:
        import torch

        torch.set_num_threads(args.threads)
        name, rows, delta = args.side
        print(RESULT + json.dumps(run_side(name, Path(rows), args.updates, args.lr, args.model, Path(delta))))
        return

    import torch
    from shared_prefix_pass import child

    work = Path(tempfile.mkdtemp(prefix="optimizer-8bit-"))
    rows = work / "grpo.pt"
    child(["--sample", "grpo", str(rows), "--threads", str(args.threads), "--model", args.model], args.threads, 3600)
    sides = {}
    for name in SIDES:
        command = [sys.executable, str(Path(__file__).resolve()), "--side", name, str(rows), str(work / f"{name}.pt"),
                   "--updates", str(args.updates), "--lr", str(args.lr), "--threads", str(args.threads),
                   "--model", args.model]
        done = subprocess.run(command, capture_output=True, text=True, cwd=HERE.parent, check=True,
                              env={**os.environ, "OMP_NUM_THREADS": str(args.threads),
                                   "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent)])})
        sides[name] = json.loads(next(line for line in done.stdout.splitlines() if line.startswith(RESULT))[len(RESULT):])
        print(f"  {name}: objective {sides[name]['objective'][0]:.4f} -> {sides[name]['objective'][-1]:.4f}, "
              f"{sides[name]['seconds_per_update']:.1f} s/update, state {sides[name]['optimizer_state_bytes'] / 1e6:.0f} MB",
              file=sys.stderr)
    a, b = (torch.load(work / f"{name}.pt") for name in SIDES)
    line = {"benchmark": "optimizer_8bit", "model": args.model, "updates": args.updates, "lr": args.lr,
            **run_record(args.threads), "sides": sides,
            "update_cosine": float(torch.nn.functional.cosine_similarity(a, b, dim=0)),
            "update_norm_ratio": float(b.norm() / a.norm()),
            "gain_ratio": sides["adamw_8bit"]["gain"] / sides["adamw"]["gain"],
            "state_bytes_ratio": sides["adamw_8bit"]["optimizer_state_bytes"] / sides["adamw"]["optimizer_state_bytes"]}
    emit(line, args.json)


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    main()
