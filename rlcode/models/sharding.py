"""FSDP2 data-parallel sharding of a causal LM (``torch.distributed.fsdp.fully_shard``).

Each decoder layer is a group of its own (its parameters gathered just before it runs, freed after),
then the root holds the rest: embeddings, final norm and head (a tied head is the embedding). Every
rank keeps 1/N of each parameter, gradient and optimizer state.

FSDP2 gathers a group's parameters in the group's ``forward``. rlcode runs three things that are not
a module's forward, and each is handled here:

- the fused-head log-probs and the packed pass call the decoder body and read the head's
  weight themselves: ``as_forward(model, function, ...)`` runs ``function(model, ...)`` as the root's
  forward (``register_fsdp_forward_method``), so the root's parameters are gathered before, the head's
  weight is a plain tensor inside (the fused head, not the full-logits fallback), and its gradients
  are reduce-scattered after the backward;
- generation runs the model once per token: ``gathered(model)`` gathers every group once around it and
  frees them after, so a decode step runs no collective (ranks may stop at different lengths) at the
  memory of the whole model for the length of the call;
- a training update runs a data-dependent number of passes per rank (micro-batches), and FSDP's collectives must come in the same order on every rank: ``gathered_for_update``
  keeps the policy gathered with gradient sync off for the update's passes, and ``gradient_sync``
  wraps one pass of the same shape on every rank that reduce-scatters the accumulated gradients
  (``rlcode.training.policy_update``). So a step holds the gathered weights and an unsharded
  gradient (parameters x (param dtype + 4) bytes) on top of the 1/N shards of the weights, gradients
  and optimizer state (what FSDP's ZeRO-3 would free between layers, traded for any step shape);
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


def broadcast_from_rank_zero(model: nn.Module, plan: ShardingPlan) -> None:
    """Every parameter and buffer of the whole (unsharded) ``model`` made rank 0's, as DDP does when it
    wraps: sharding keeps each rank's own slice of its own copy, and copies made at random (LoRA's
    adapters, a model built from a config) differ between ranks."""
    import torch.distributed as dist

    group, device = plan.mesh.get_group(), torch.device(plan.mesh.device_type)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            moved = tensor.data.to(device)
            dist.broadcast(moved, src=dist.get_global_rank(group, 0), group=group)
            if moved is not tensor.data:
                tensor.data.copy_(moved)


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
    with _gathered(model, for_update=False):
        yield


@contextlib.contextmanager
def gathered_for_update(model: nn.Module) -> Iterator[None]:
    """``gathered``, and kept gathered through backward with gradient sync off: the block's passes run
    no collective, whatever their number and shape on each rank, and the gradients accumulate
    unsharded (in fp32 under bf16 mixed precision). ``gradient_sync`` around one last pass of the same
    shape on every rank reduce-scatters them. No-op unsharded."""
    with _gathered(model, for_update=True):
        yield


@contextlib.contextmanager
def gradient_sync(model: nn.Module) -> Iterator[None]:
    """Inside ``gathered_for_update``: the block's backward reduce-scatters the accumulated gradients."""
    modules = fsdp_modules(model)
    for module in modules:
        module.set_requires_gradient_sync(True, recurse=False)
    try:
        yield
    finally:
        for module in modules:
            module.set_requires_gradient_sync(False, recurse=False)


@contextlib.contextmanager
def _gathered(model: nn.Module, for_update: bool) -> Iterator[None]:
    modules = fsdp_modules(model)
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        if for_update:
            module.set_reshard_after_backward(False, recurse=False)
            module.set_requires_gradient_sync(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            # the layers free after each forward again; the root keeps what FSDP chose for it (not to)
            module.set_reshard_after_forward(module is not model, recurse=False)
            if for_update:
                module.set_reshard_after_backward(True, recurse=False)
                module.set_requires_gradient_sync(True, recurse=False)
            module.reshard()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a collective: every rank must call it), or the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
