"""Per-rank training state and all-gathers per generated token under rlcode's FSDP2 sharding, on CPU.

Measures, on 1, 2 and 4 CPU processes over gloo (``torch.multiprocessing.spawn``, 1 torch thread per
rank), a random-init Qwen2 (hidden 512, 8 layers, vocabulary 8192, tied head, float32, ~25.7M
parameters):

1. the training state each rank holds after one AdamW step: bytes of parameters + gradients +
   optimizer state, counted exactly from the tensors' local storage (a DTensor's ``to_local()``, each
   distinct storage once, FSDP's padding included), under the peer, DDP
   (``DistributedDataParallel``, every rank a whole copy), and under FSDP2 as rlcode does it
   (``broadcast_from_rank_zero``, ``shard_model`` on a 1-D CPU mesh; the update's pass inside
   ``gathered_for_update`` then one zero-weighted pass in ``gradient_sync`` that reduce-scatters, as
   ``rlcode.training.policy_update`` runs it). DDP's gradient buckets (about one more copy of the
   parameters) are not counted. Second figures, per rank: the RSS after the step (after
   ``malloc_trim``: what the process still holds, imports included) and the peak RSS (which under
   FSDP includes the whole model built before sharding, as rlcode loads it, and the gathered update);
2. the extra memory rlcode's update holds while gathered: inside ``gathered_for_update`` after the
   backward, the storage of the whole (unsharded) parameters and their unsharded fp32 gradients;
3. FSDP all-gathers per generated token on 2 ranks (``foreach_all_gather`` of FSDP's param-group
   module wrapped with a counter): 16 greedy tokens with the model's own forward and KV cache, once
   plain (the peer: every forward gathers each layer) and once inside ``gathered(model)`` (gathered
   once for the call), each rank on its own prompt; the greedy tokens of both must equal those of an
   unsharded copy of the same weights.

    python benchmarks/sharding_memory.py [--ranks 1 2 4] [--new_tokens 16]

Prints a table; writes benchmarks/results/sharding_memory_<date>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import socket
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODEL = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=8192, tie_word_embeddings=True, max_position_embeddings=512)
BATCH, SEQ, PROMPT = 2, 64, 8  # training rows x tokens per rank; decode prompt length
MB = 2 ** 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rss_mb(trim: bool = False) -> float:
    if trim:  # hand the allocator's freed pages back first (glibc keeps them): what is still held
        import ctypes
        import gc

        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB


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


def _build(seed: int = 0):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(**MODEL)).float()


def _setup(rank: int, world: int, port: int):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return torch, dist


def _train_worker(rank: int, world: int, port: int, mode: str, out: str) -> None:
    torch, dist = _setup(rank, world, port)
    from torch.distributed.device_mesh import init_device_mesh

    from rlcode.models.sharding import (ShardingPlan, broadcast_from_rank_zero, gathered_for_update,
                                        gradient_sync, shard_model)

    rss_before = _rss_mb()
    model = _build()
    torch.manual_seed(100 + rank)  # each rank its own rows
    ids = torch.randint(0, MODEL["vocab_size"], (BATCH, SEQ))
    result = {"rank": rank}
    if mode == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        wrapped(input_ids=ids, labels=ids).loss.backward()
    else:
        plan = ShardingPlan(init_device_mesh("cpu", (world,)))
        broadcast_from_rank_zero(model, plan)
        shard_model(model, plan)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        with gathered_for_update(model):
            (model(input_ids=ids, labels=ids).loss * world).backward()
            seen: set = set()  # now gathered: plain whole parameters, unsharded gradients
            params = list(model.parameters())
            result["gathered_extra"] = {"params": _storage_bytes(params, seen),
                                        "grads": _storage_bytes([p.grad for p in params], seen)}
            with gradient_sync(model):  # rlcode's one fixed-shape zero-weighted pass: reduce-scatters
                (model(input_ids=ids[:1, :1]).logits.sum() * 0.0).backward()
    optimizer.step()
    result["state"] = _state_bytes(model, optimizer)
    result["rss_before_model_mb"], result["rss_after_step_mb"] = rss_before, _rss_mb(trim=True)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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


def _decode_worker(rank: int, world: int, port: int, new_tokens: int, out: str) -> None:
    import copy

    torch, dist = _setup(rank, world, port)
    import torch.distributed.fsdp._fully_shard._fsdp_param_group as param_group
    from torch.distributed.device_mesh import init_device_mesh

    from rlcode.models.sharding import ShardingPlan, broadcast_from_rank_zero, gathered, reshard, shard_model

    count = [0]
    original = param_group.foreach_all_gather

    def counted(*args, **kwargs):
        count[0] += 1
        return original(*args, **kwargs)
    param_group.foreach_all_gather = counted

    model = _build().eval()
    plan = ShardingPlan(init_device_mesh("cpu", (world,)))
    broadcast_from_rank_zero(model, plan)
    reference = copy.deepcopy(model)
    shard_model(model, plan)
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
    result["tokens"] = expected.tolist()[0]
    Path(out, f"decode_{world}_{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _spawn(worker, world: int, *args) -> list[dict]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        mp.spawn(worker, args=(world, _free_port(), *args, out), nprocs=world, join=True)
        return [json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"), key=lambda p: p.name)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--new_tokens", type=int, default=16)
    args = parser.parse_args()
    import torch
    import transformers

    with torch.device("meta"):
        n_params = sum(p.numel() for p in _build().parameters())
    rows, table = [], []
    for world in args.ranks:
        for mode in ("ddp", "fsdp"):
            ranks = _spawn(_train_worker, world, mode)
            state = [sum(r["state"].values()) for r in ranks]
            row = {"mode": mode, "ranks": world, "state_mb_max": max(state) / MB, "state_mb_min": min(state) / MB,
                   "state_by_kind_rank0_mb": {k: v / MB for k, v in ranks[0]["state"].items()},
                   "peak_rss_mb_max": max(r["peak_rss_mb"] for r in ranks),
                   "rss_after_step_mb_max": max(r["rss_after_step_mb"] for r in ranks),
                   "rss_before_model_mb": ranks[0]["rss_before_model_mb"]}
            if mode == "fsdp":
                row["gathered_extra_mb"] = max(sum(r["gathered_extra"].values()) for r in ranks) / MB
            rows.append(row)
            print(f"{mode} {world}: state {row['state_mb_max']:.1f} MB/rank, peak RSS {row['peak_rss_mb_max']:.0f} MB",
                  flush=True)
    decode = _spawn(_decode_worker, 2, args.new_tokens)
    base = {r["ranks"]: r["state_mb_max"] for r in rows if r["mode"] == "fsdp"}
    print(f"\nQwen2 {n_params / 1e6:.1f}M params float32 ({n_params * 4 / MB:.1f} MB), one AdamW step, per rank:")
    print(f"{'ranks':>5} | {'DDP state MB':>12} | {'FSDP state MB':>13} | {'FSDP x1':>7} | {'gathered extra MB':>17} | "
          f"RSS after step MB DDP / FSDP | peak RSS MB DDP / FSDP")
    for world in args.ranks:
        ddp, fsdp = (next(r for r in rows if r["mode"] == m and r["ranks"] == world) for m in ("ddp", "fsdp"))
        ratio = fsdp["state_mb_max"] / base[args.ranks[0]] if args.ranks[0] == 1 else float("nan")
        table.append(f"{world:>5} | {ddp['state_mb_max']:>12.1f} | {fsdp['state_mb_max']:>13.1f} | {ratio:>7.3f} | "
                     f"{fsdp['gathered_extra_mb']:>17.1f} | {ddp['rss_after_step_mb_max']:>15.0f} / "
                     f"{fsdp['rss_after_step_mb_max']:<10.0f} | {ddp['peak_rss_mb_max']:>11.0f} / "
                     f"{fsdp['peak_rss_mb_max']:.0f}")
    print("\n".join(table))
    print(f"\nall-gathers per generated token, 2 ranks, {args.new_tokens} greedy tokens:")
    for name in ("plain", "gathered"):
        print(f"  {name:>8}: {[r[name]['all_gathers'] for r in decode]} all-gathers per rank "
              f"({decode[0][name]['per_token']:.3f}/token), tokens equal the unsharded copy's: "
              f"{all(r[name]['tokens_equal_unsharded'] for r in decode)}")
    record = {"date": datetime.date.today().isoformat(), "torch": torch.__version__,
              "transformers": transformers.__version__, "model": MODEL, "parameters": n_params,
              "train_batch_per_rank": [BATCH, SEQ], "threads_per_rank": 1, "cpus": os.cpu_count(),
              "training_state": rows, "decode": {"ranks": 2, "prompt_tokens": PROMPT, "new_tokens": args.new_tokens,
                                                 "per_rank": decode}}
    path = REPO / "benchmarks" / "results" / f"sharding_memory_{record['date']}.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
