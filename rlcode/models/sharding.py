"""FSDP2 data-parallel sharding of a causal LM (``torch.distributed.fsdp.fully_shard``).

Each decoder layer is a group of its own (its parameters gathered just before it runs, freed after),
then the root holds the rest: embeddings, final norm and head (a tied head is the embedding). Every
rank keeps 1/N of each parameter, gradient and optimizer state.

FSDP2 gathers a group's parameters in the group's ``forward``. What rlcode does around that:

- the fused-head log-probs and the packed pass call the decoder body and read the head's
  weight themselves: ``as_forward(model, function, ...)`` runs ``function(model, ...)`` as the root's
  forward (``register_fsdp_forward_method``), so the root's parameters are gathered before, the head's
  weight is a plain tensor inside (the fused head, not the full-logits fallback), and its gradients
  are reduce-scattered after the backward;
- loading: rank 0 holds the whole model; the others may build it on the meta device
  (``load_model(weights=False)``). ``shard_from_rank_zero`` shards it, then broadcasts rank 0's tensors
  one at a time, each rank keeping its slice: a node holds one whole copy at load, not one per rank;
- generation runs the model once per token: ``gathered(model)`` gathers every group once around it and
  frees them after, so a decode step runs no collective (ranks may stop at different lengths) at the
  memory of the whole model for the length of the call;
- a training update runs FSDP as designed: each layer's parameters gathered for its forward and again
  for its backward, freed after each, gradients reduce-scattered into fp32 shards after every
  micro-batch. FSDP's collectives must come in the same order on every rank, so every rank runs the
  same number of passes (``rlcode.training.policy_update`` agrees on the count; a rank with fewer
  micro-batches runs zero-weighted ones), each one decoder call (packed or plain) through every layer.
  A step's peak is then the 1/N shards of weights, gradients and optimizer state plus about two
  gathered layers, the root (embeddings, head) and one micro-batch's activations;
- a pass without gradients leaves the root gathered (FSDP keeps the root for the backward it expects
  next); an optimizer built then would hold the gathered copies and never update the shards, and the
  memory stays taken: ``reshard(model)`` after every such pass, and before the optimizer is built.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from rlcode.errors import SettingError

AS_FORWARD = "rlcode_as_forward"  # the root's method that FSDP treats as a forward


@dataclass(frozen=True)
class ShardingPlan:
    """How to shard: the data-parallel mesh and the dtypes of the gathered parameters and the gradients'
    reduction (None: the parameters' own; ``precision_policy`` derives them from a Lightning precision)."""

    mesh: object  # torch.distributed.device_mesh.DeviceMesh (1-D, data parallel)
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None


def precision_policy(precision: str) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(param_dtype, reduce_dtype) for a Lightning precision string under FSDP.

    bf16-mixed: bf16 gathered parameters and compute, fp32 gradient reduction and master weights (the
    shards). Full precisions ("32-true", "64-true", "bf16-true") keep their own dtype. 16-mixed (V100
    and older, no bf16) is refused: fp16 compute needs loss scaling, which FSDP2's mixed precision
    does not do under Lightning; sharded runs there train in "32-true" (what the platform rule picks).
    """
    text = str(precision)
    if text.startswith("16-mixed") or text == "16":
        raise ValueError("FSDP does not train in 16-mixed (fp16 needs loss scaling that FSDP2 does not do under "
                         "Lightning): use --trainer.precision 32-true with --trainer.strategy fsdp on GPUs without "
                         "bf16 (before sm_80), or strategy ddp to keep 16-mixed")
    if text.startswith("bf16-mixed"):
        return torch.bfloat16, torch.float32
    return None, None


def sharding_plan(mesh, precision: str, quantization: str | None = None) -> ShardingPlan | None:
    """The plan for a strategy's device mesh (None without one: nothing is sharded), its data-parallel
    dimension when the mesh has named ones; the dtypes from ``precision`` (``precision_policy``)."""
    if mesh is None:
        return None
    if quantization is not None:  # bitsandbytes' packed weights are not sharded by FSDP2
        raise SettingError(f"model.quantization={quantization!r} cannot be sharded: use --trainer.strategy ddp "
                           "with QLoRA (its frozen 4-bit base is small), or drop the quantization")
    param_dtype, reduce_dtype = precision_policy(precision)
    data_parallel = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
    return ShardingPlan(data_parallel, param_dtype, reduce_dtype)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks, found by transformers' ``_no_split_modules`` (the decoder layer
    classes it never splits across devices; peft's wrapper unwrapped)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(base, "_no_split_modules", None) or ())
    layers = [module for module in model.modules() if type(module).__name__ in names]
    if not layers:
        raise ValueError(f"cannot shard {type(base).__name__}: it names no decoder layer class (_no_split_modules)")
    return layers


def is_rank_zero(plan: ShardingPlan) -> bool:
    """Whether this process is rank 0 of the data-parallel group: the one that loads whole weights."""
    return plan.mesh.get_local_rank() == 0


def shard_from_rank_zero(model: nn.Module, plan: ShardingPlan) -> nn.Module:
    """Shard ``model`` in place (``shard_model``) holding rank 0's weights on every rank; returns it.

    Rank 0's ``model`` is whole; another rank's may be whole (a copy handed in, LoRA adapters drawn at
    random, which must become rank 0's as DDP makes them) or on the meta device (built from the config
    alone). Each of rank 0's tensors is broadcast in turn and every rank keeps its own slice
    (``set_model_state_dict(broadcast_from_rank0=True)``); buffers, rotary tables among them, are not all
    in a state dict and are broadcast whole.
    """
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    # rank 0's whole tensors (references, not copies): held until broadcast, then freed with the model's
    whole = model.state_dict() if is_rank_zero(plan) else {}
    shard_model(model, plan)
    device = torch.device(plan.mesh.device_type)
    if any(tensor.is_meta for tensor in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=device)
    set_model_state_dict(model, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    del whole
    group = plan.mesh.get_group()
    with torch.no_grad():
        for buffer in model.buffers():
            moved = buffer.to(device)
            dist.broadcast(moved, src=dist.get_global_rank(group, 0), group=group)
            if moved is not buffer:
                buffer.copy_(moved)
    return model


def shard_model(model: nn.Module, plan: ShardingPlan) -> nn.Module:
    """Shard ``model`` in place, each decoder layer then the root; returns it (now an FSDPModule)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    policy = MixedPrecisionPolicy(param_dtype=plan.param_dtype, reduce_dtype=plan.reduce_dtype)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=plan.mesh, mp_policy=policy)
    fully_shard(model, mesh=plan.mesh, mp_policy=policy)
    object.__setattr__(model, AS_FORWARD, _call_with_model.__get__(model))  # an instance method, not a submodule
    register_fsdp_forward_method(model, AS_FORWARD)
    return model


def _call_with_model(self: nn.Module, function: Callable, *args, **kwargs):
    return function(self, *args, **kwargs)


def as_forward(model: nn.Module, function: Callable, *args, **kwargs):
    """``function(model, *args, **kwargs)``, run as the root's forward when ``model`` is sharded."""
    if is_sharded(model):
        return getattr(model, AS_FORWARD)(function, *args, **kwargs)
    return function(model, *args, **kwargs)


def fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [module for module in model.modules() if isinstance(module, FSDPModule)]


def reshard(model: nn.Module) -> None:
    """Free every gathered group of ``model`` (a no-op when it is not sharded)."""
    for module in fsdp_modules(model):
        module.reshard()


@contextlib.contextmanager
def gathered(model: nn.Module) -> Iterator[None]:
    """Every group of a sharded ``model`` gathered once for the block, freed after (no-op unsharded):
    for passes without gradients, generation above all."""
    modules = fsdp_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            # the layers free after each forward again; the root keeps what FSDP chose for it (not to)
            module.set_reshard_after_forward(module is not model, recurse=False)
            module.reshard()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every rank must call it), or the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
