"""Per-rank memory of rlcode's FSDP2 sharding on CPU ranks: the peak of a training step, the host
memory of loading, the persistent state, and all-gathers per generated token.

On 1, 2 and 4 CPU processes over gloo (``torch.multiprocessing.spawn``, 1 torch thread per rank), a
random-init Qwen2 (hidden 512, 24 layers, vocabulary 8192, tied head, float32, ~79M parameters) saved
as a Hugging Face folder, so loading reads safetensors as a user's run does:

1. **load**: FSDP as rlcode loads it (rank 0 ``load_model``, the others ``load_model(weights=False)``
   on the meta device, then ``shard_from_rank_zero``), against the peer, every rank loading the whole
   model (what DDP does, and rlcode's FSDP did before), its mapped safetensors pages read once. Each
   rank's peak RSS over the load above its RSS before the model (``VmHWM`` of /proc/self/status; the
   mark reset just before; the imports loading needs are in that baseline), summed over the ranks: the
   host memory a node needs to start, in copies of the model. Expected: rank 0's whole copy, the shards
   (one copy in all) and a broadcast tensor per rank. Goal: from 1 rank to N the sum grows by at most
   half a copy (the peer: by N - 1 copies).
2. **step**: one GRPO update through rlcode's own ``update_policy`` (2 rows of 8 prompt + 56
   completion tokens per rank, micro-batches of one row, AdamW), the peak reset after loading: its
   peak RSS above the pre-model RSS. The peer, "whole copy", keeps every weight, gradient and AdamW
   state whole on every rank and all-reduces the gradients (DDP's memory without its buckets).
   Goal: FSDP's step peak at 2 ranks <= 0.6x its 1-rank peak, at 4 ranks <= 0.4x.
   Also the training state each rank holds after the step, counted exactly from the tensors' local
   storage (each distinct storage once, FSDP's padding included).
3. **decode**: FSDP all-gathers per generated token on 2 ranks (``foreach_all_gather`` counted): 16
   greedy tokens plain (every forward gathers each layer) and inside ``gathered(model)`` (once for the
   call); the tokens must equal an unsharded copy's.

The workers run with ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB: every large tensor is its own mapping,
returned to the system when freed, so RSS follows the live tensors (glibc's default raises the
threshold after the first large free and then keeps freed heap pages, which measures the allocator's
history, not the memory a step needs). GPU peaks (CUDA's caching allocator) are not measured here.

    python benchmarks/sharding_memory.py [--ranks 1 2 4] [--new_tokens 16]

Prints a table; writes benchmarks/results/sharding_memory_<date>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import socket
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

MODEL = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=24, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=8192, tie_word_embeddings=True, max_position_embeddings=512)
ROWS, PROMPT, COMPLETION = 2, 8, 56  # training rows per rank, their prompt and completion tokens
GOALS = {2: 0.6, 4: 0.4}  # FSDP step peak over its 1-rank peak
LOAD_GROWTH = 0.5  # FSDP's load summed over ranks grows by at most half a model copy from 1 rank to N (the peer: N - 1)
MB = 2 ** 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _trim() -> None:
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak() -> float:
    """Trim, reset the peak RSS mark to the present RSS (``clear_refs`` 5), return that RSS (MB)."""
    _trim()
    Path("/proc/self/clear_refs").write_text("5")
    return _status_mb("VmRSS")


def _storage_bytes(tensors, seen: set) -> int:
    """Bytes of the distinct storages behind ``tensors`` (DTensors: their local shard), each once."""
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        if storage.data_ptr() not in seen and storage.nbytes():
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def _state_bytes(model, optimizer) -> dict:
    seen: set = set()
    params = list(model.parameters())
    states = [v for state in optimizer.state.values() for v in state.values() if hasattr(v, "untyped_storage")]
    return {"params": _storage_bytes(params, seen), "grads": _storage_bytes([p.grad for p in params], seen),
            "optimizer": _storage_bytes(states, seen)}


def _save_model(folder: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**MODEL)).float().save_pretrained(folder)


def _setup(rank: int, world: int, port: int):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return torch, dist


def _rollout(rank: int):
    import torch

    from rlcode.rollout.assembly import batch_from_token_lists

    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own rows
    ids = torch.randint(3, MODEL["vocab_size"], (ROWS, PROMPT + COMPLETION), generator=generator).tolist()
    return batch_from_token_lists([row[:PROMPT] for row in ids], [row[PROMPT:] for row in ids], [True] * ROWS,
                                  ["x"] * ROWS, pad_token_id=0)


def _train_worker(rank: int, world: int, port: int, mode: str, folder: str, out: str) -> None:
    torch, dist = _setup(rank, world, port)
    from torch.distributed.device_mesh import init_device_mesh

    from rlcode.algorithms.losses import LossTotals
    from rlcode.models.loading import load_model
    from rlcode.models.sharding import ShardingPlan, shard_from_rank_zero
    from rlcode.training.all_ranks_totals import Ranks
    from rlcode.training.policy_update import TrainerHooks, UpdateSettings, update_policy

    rollout = _rollout(rank)
    load_model("tiny-random")  # warm-up: the imports loading needs (~170 MB) belong to the baseline
    Ranks(world).count_range(0)  # and gloo's first buffers
    before_model = _reset_peak()
    if mode == "fsdp":
        model = load_model(folder, weights=rank == 0)
        shard_from_rank_zero(model, ShardingPlan(init_device_mesh("cpu", (world,))))
    else:  # the peer: every rank reads the whole model and keeps it
        model = load_model(folder)
        with torch.no_grad():  # safetensors maps the file: its pages count once read, as generation reads them
            for p in model.parameters():
                p.sum()
    load_peak = _status_mb("VmHWM")
    after_load = _reset_peak()

    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step(counted: bool) -> None:
        if mode == "whole":  # DDP's gradient all-reduce, whole gradients on every rank
            for p in model.parameters():
                if p.grad is not None and world > 1:
                    dist.all_reduce(p.grad)
        optimizer.step()
        if counted:  # the gradients of the step stay for the state count; a real run zeroes them
            return
        optimizer.zero_grad(set_to_none=True)

    loss_mask = rollout.completion_mask.float()
    hooks = TrainerHooks(backward=lambda loss: loss.backward(), no_sync=contextlib.nullcontext, step=step,
                         world_size=world, count_range=Ranks(world).count_range)
    settings = UpdateSettings(loss_type="dapo", beta=0.0, epsilon_low=0.2, epsilon_high=0.2,
                              importance_sampling_level="token", num_iterations=1, micro_batch_size=1,
                              share_prefix=True, temperature=1.0, max_new_tokens=COMPLETION)
    update_policy(model, hooks, settings, rollout, loss_mask, torch.tensor([1.0, -1.0]), None,
                  torch.arange(ROWS), LossTotals.of(loss_mask))
    step_peak = _status_mb("VmHWM")
    result = {"rank": rank, "rss_before_model_mb": before_model, "load_peak_mb": load_peak,
              "rss_after_load_mb": after_load, "step_peak_mb": step_peak,
              "state": _state_bytes(model, optimizer)}
    Path(out, f"{mode}_{world}_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _greedy(model, prompt, new_tokens: int):
    import torch

    past, current, tokens = None, prompt, []
    with torch.no_grad():
        for _ in range(new_tokens):
            output = model(input_ids=current, cache=past, use_cache=True)  # transformers 5's cache keyword
            past, current = output.cache, output.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(current)
    return torch.cat(tokens, dim=1)


def _decode_worker(rank: int, world: int, port: int, new_tokens: int, folder: str, out: str) -> None:
    import copy

    torch, dist = _setup(rank, world, port)
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
    from torch.distributed.device_mesh import init_device_mesh

    from rlcode.models.loading import load_model
    from rlcode.models.sharding import ShardingPlan, gathered, reshard, shard_from_rank_zero

    count = [0]
    original = param_group.foreach_all_gather

    def counted(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)
    param_group.foreach_all_gather = counted

    model = load_model(folder).eval()  # whole on every rank: the unsharded copy to compare with
    reference = copy.deepcopy(model)
    shard_from_rank_zero(model, ShardingPlan(init_device_mesh("cpu", (world,))))
    torch.manual_seed(200 + rank)
    prompt = torch.randint(0, MODEL["vocab_size"], (1, PROMPT))
    expected = _greedy(reference, prompt, new_tokens)
    result = {"rank": rank}
    for name in ("plain", "gathered"):
        reshard(model)
        count[0] = 0
        with gathered(model) if name == "gathered" else contextlib.nullcontext():
            tokens = _greedy(model, prompt, new_tokens)
        reshard(model)
        result[name] = {"all_gathers": count[0], "per_token": count[0] / new_tokens,
                        "tokens_equal_unsharded": bool(torch.equal(tokens, expected))}
    Path(out, f"decode_{world}_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _spawn(worker, world: int, *args) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(worker, args=(world, _free_port(), *args, out), nprocs=world, join=True)
        return [json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"), key=lambda p: p.name)]


def _summary(mode: str, world: int, ranks: list[dict]) -> dict:
    """Per-rank figures of one run, as MB above each rank's pre-model RSS."""
    state = [sum(r["state"].values()) / MB for r in ranks]
    return {"mode": mode, "ranks": world,
            "step_peak_above_base_mb_max": max(r["step_peak_mb"] - r["rss_before_model_mb"] for r in ranks),
            "load_peak_above_base_mb_sum": sum(r["load_peak_mb"] - r["rss_before_model_mb"] for r in ranks),
            "load_peak_above_base_mb_max": max(r["load_peak_mb"] - r["rss_before_model_mb"] for r in ranks),
            "step_peak_above_base_mb_by_rank": [r["step_peak_mb"] - r["rss_before_model_mb"] for r in ranks],
            "load_peak_above_base_mb_by_rank": [r["load_peak_mb"] - r["rss_before_model_mb"] for r in ranks],
            "state_mb_max": max(state), "state_by_kind_rank0_mb": {k: v / MB for k, v in ranks[0]["state"].items()},
            "per_rank": ranks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--new_tokens", type=int, default=16)
    args = parser.parse_args()
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from run_record import run_record

    os.environ["MALLOC_MMAP_THRESHOLD_"] = str(128 * 1024)  # read by the workers' glibc (see the docstring)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in Qwen2ForCausalLM(Qwen2Config(**MODEL)).parameters())
    model_mb = n_params * 4 / MB
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        _save_model(Path(folder))
        for world in args.ranks:
            for mode in ("whole", "fsdp"):
                row = _summary(mode, world, _spawn(_train_worker, world, mode, folder))
                rows.append(row)
                print(f"{mode:>5} x{world}: step peak {row['step_peak_above_base_mb_max']:.0f} MB/rank, load "
                      f"{row['load_peak_above_base_mb_sum']:.0f} MB summed, state {row['state_mb_max']:.0f} MB/rank",
                      flush=True)
        decode = _spawn(_decode_worker, 2, args.new_tokens, folder)
    fsdp = {r["ranks"]: r for r in rows if r["mode"] == "fsdp"}
    base = fsdp.get(1, {}).get("step_peak_above_base_mb_max")
    goals = {}
    for world, goal in GOALS.items():
        if base and world in fsdp:
            ratio = fsdp[world]["step_peak_above_base_mb_max"] / base
            goals[f"step_peak_{world}_ranks_over_1"] = {"ratio": round(ratio, 3), "goal": goal, "met": ratio <= goal}
    for world, row in fsdp.items():  # a node's load: rank 0's whole copy + the shards, not a copy per rank
        copies = row["load_peak_above_base_mb_sum"] / model_mb
        growth = copies - fsdp[args.ranks[0]]["load_peak_above_base_mb_sum"] / model_mb
        goals[f"load_{world}_ranks"] = {"model_copies": round(copies, 3), "growth_over_fewest_ranks": round(growth, 3),
                                        "goal_growth": LOAD_GROWTH, "met": growth <= LOAD_GROWTH}
    print(f"\nQwen2 {n_params / 1e6:.1f}M params float32 ({model_mb:.0f} MB); MB above the pre-model RSS:")
    print(f"{'ranks':>5} | {'step peak/rank whole / FSDP':>27} | {'FSDP x1':>7} | "
          f"{'load summed over ranks whole / FSDP':>35} | state/rank whole / FSDP")
    for world in args.ranks:
        whole, sharded = (next(r for r in rows if r["mode"] == m and r["ranks"] == world) for m in ("whole", "fsdp"))
        ratio = sharded["step_peak_above_base_mb_max"] / base if base else float("nan")
        print(f"{world:>5} | {whole['step_peak_above_base_mb_max']:>12.0f} / {sharded['step_peak_above_base_mb_max']:<12.0f}"
              f" | {ratio:>7.3f} | {whole['load_peak_above_base_mb_sum']:>16.0f} / "
              f"{sharded['load_peak_above_base_mb_sum']:<16.0f} | {whole['state_mb_max']:.0f} / {sharded['state_mb_max']:.0f}")
    print(f"goals: {json.dumps(goals)}")
    print(f"\nall-gathers per generated token, 2 ranks, {args.new_tokens} greedy tokens:")
    for name in ("plain", "gathered"):
        print(f"  {name:>8}: {[r[name]['all_gathers'] for r in decode]} all-gathers per rank "
              f"({decode[0][name]['per_token']:.3f}/token), tokens equal the unsharded copy's: "
              f"{all(r[name]['tokens_equal_unsharded'] for r in decode)}")
    record = {"date": datetime.date.today().isoformat(), **run_record(threads=1), "model": MODEL,
              "parameters": n_params, "model_mb": model_mb, "rows_per_rank": [ROWS, PROMPT, COMPLETION],
              "malloc_mmap_threshold": os.environ["MALLOC_MMAP_THRESHOLD_"], "runs": rows, "goals": goals,
              "decode": {"ranks": 2, "prompt_tokens": PROMPT, "new_tokens": args.new_tokens, "per_rank": decode}}
    path = REPO / "benchmarks" / "results" / f"sharding_memory_{record['date']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
