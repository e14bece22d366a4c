"""What leaves a sharded (FSDP2) policy whole: the vLLM weight stream (``streamed_weights``, LoRA merged
out of place) gathers each tensor from the shards and equals the unsharded policy's stream, name for
name and bit for bit; and greedy decoding through the HF backend on the sharded policy (gathered once
for the call) equals the unsharded policy's. Two CPU ranks over gloo (``torch.multiprocessing``)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow  # two processes (10-20 s)

LORA = {"r": 4, "alpha": 8, "dropout": 0.0}


def _policy(lora: bool):
    from rlcode.models import LoraSettings, load_model

    torch.manual_seed(0)
    model = load_model("tiny-random", lora=LoraSettings(**LORA) if lora else None)
    if lora:  # LoRA B starts at zero: move it, so the merge has something to add
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(std=0.02)
    return model


def _rank(rank: int, port: int, lora: bool, out: dict) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from rlcode.models import load_tokenizer
    from rlcode.models.sharding import ShardingPlan, shard_model
    from rlcode.rollout import SamplingParams
    from rlcode.rollout.hf_backend import HFGenerateBackend
    from rlcode.rollout.vllm.weights import streamed_weights

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    whole, sharded = _policy(lora), _policy(lora)
    shard_model(sharded, ShardingPlan(init_device_mesh("cpu", (2,))))
    tokenizer = load_tokenizer("tiny-random")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    prompts = ["def add(a, b):", "class Stack:"] if rank == 0 else ["import math"]  # ranks stop at other lengths
    decoded = [HFGenerateBackend(model, tokenizer).generate(prompts, 1, greedy).completion_ids for model in (whole, sharded)]
    streams = [dict(streamed_weights(model)) for model in (whole, sharded)]
    if rank == 0:
        out.update(decoded=decoded, streams=streams)
    dist.barrier()  # rank 1 must not tear gloo down while rank 0 still sends its results (SIGABRT seen)
    dist.destroy_process_group()
    # Leave without interpreter finalization: gloo's worker threads can still hold FSDP's async
    # all-gather work, whose tensors then die while the interpreter is torn down, an abort ("terminate
    # called without an active exception", once in a CI run) after every assertion's input was sent.
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("lora", [False, True])
def test_weights_and_greedy_tokens_leave_a_sharded_policy_whole(lora):
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_rank, args=(_free_port(), lora, out), nprocs=2, join=True)
    whole, sharded = out["streams"]
    assert list(whole) == list(sharded) and whole
    assert all(torch.equal(whole[name], sharded[name]) for name in whole)
    assert not any(type(tensor).__name__ == "DTensor" for tensor in sharded.values())
    assert torch.equal(*out["decoded"])
