"""Building a colocated vLLM engine inside the trainer's process, the way TRL 1.16's colocate mode does.

vLLM 0.33 has only its V1 engine. Left to its defaults it runs the model in a separate process
(``VLLM_ENABLE_V1_MULTIPROCESSING``), where the trainer cannot reach it to load new weights, and every
DDP rank's engine lands on cuda:0. TRL builds it with ``distributed_executor_backend=
"external_launcher"``: the engine then runs in-process, one per rank, joining the trainer's
torch.distributed world through ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` (and ``MASTER_ADDR`` /
``MASTER_PORT`` when that world does not exist yet). Those variables are set here for the build
only: left behind, ``LOCAL_RANK`` would make a later Lightning Trainer in the same process believe
its processes were launched externally.

Building an engine also changes the process it runs in: vLLM seeds Python's, NumPy's and torch's
global generators, sets the current CUDA device and float32 matmul precision (its GPU worker),
freezes the garbage collector's heap (``gc.freeze()``, its engine core), caches ``vllm.envs`` so
that later environment changes are not seen, and creates tensors under whatever default dtype and
device are active (Lightning's ``configure_model`` runs under its own). ``outside_trainer_contexts``
builds it under plain defaults and puts the trainer's state back afterwards.

With several ranks the build is a collective (vLLM joins the trainer's world): a rank that builds
alone would wait forever. ``wait_for_every_rank`` meets the other ranks through the process group's
store first, and raises with the fix when they do not come.

Nothing here imports vllm: the caller passes the module in (tests pass a stand-in).
"""

from __future__ import annotations

import gc
import itertools
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.distributed as dist

from rlcode.setting import COUNT, IMPORTANCE_CAP, POSITIVE, Range, check_arguments, field_of

# The vLLM releases this code was written against (read from their source, never run here).
TESTED_VLLM_VERSIONS = ">=0.33.0,<0.34"


@dataclass
class VLLMSettings:
    """How the colocated vLLM engine is built and used (``rollout_backend: vllm`` only).

    Args:
        gpu_memory_utilization: share of the GPU's memory vLLM may take for its weights and KV
            cache; the trainer needs the rest. On vLLM's CPU build: the share of host memory, less
            everything this process (the trainer) already holds.
        kv_cache_gib: the KV cache's size outright, in GiB (vLLM's ``kv_cache_memory_bytes``;
            ``gpu_memory_utilization`` then no longer sizes it). On CPU the way to give a colocated
            engine a cache whatever the trainer holds.
        max_model_len: longest prompt + completion in tokens. vLLM reserves KV cache for at least
            one sequence this long, so the model's own limit can cost most of the memory. None: the
            smaller of ``DEFAULT_MAX_MODEL_LEN`` and the model's limit (``max_position_embeddings``).
        max_num_seqs: sequences decoded together (None: vLLM's default).
        max_num_batched_tokens: tokens per engine step; also what vLLM's memory profiler runs
            with (TRL: 4096; vLLM's larger default misleads its profiler when sharing a GPU).
        dtype: weight dtype of the engine ("auto": the checkpoint's).
        enable_prefix_caching: reuse a prompt's KV cache across its G samples.
        enforce_eager: no CUDA graphs (faster start, slower decoding).
        enable_sleep_mode: free the engine's GPU memory between generations (level 2 sleep after
            each generate; the weights are pushed again before the next one).
        importance_sampling_correction: weight the policy loss by TRL's truncated importance ratio
            between the trainer's and vLLM's log-probs of the sampled tokens (vLLM samples with
            its own kernels, usually in bf16, so its distribution is not exactly the policy's).
        importance_sampling_cap: upper bound of that ratio (TRL's ``vllm_importance_sampling_clip_max``).
    """

    gpu_memory_utilization: Annotated[float, field_of(Range(0, 1, low_open=True))] = 0.3
    kv_cache_gib: Annotated[float, field_of(POSITIVE)] | None = None
    max_model_len: Annotated[int, field_of(COUNT)] | None = None
    max_num_seqs: Annotated[int, field_of(COUNT)] | None = None
    max_num_batched_tokens: Annotated[int, field_of(COUNT)] = 4096
    dtype: str = "auto"
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    enable_sleep_mode: bool = False
    importance_sampling_correction: bool = True
    importance_sampling_cap: Annotated[float, field_of(IMPORTANCE_CAP)] = 3.0

    def __post_init__(self) -> None:
        check_arguments(VLLMSettings, vars(self), prefix="model.vllm.")


DEFAULT_MAX_MODEL_LEN = 4096  # TRL's colocate default; a model with a shorter limit gets its own


def model_max_len(settings: VLLMSettings, config) -> int | None:
    """The ``max_model_len`` an engine of the model with this ``config`` gets (None: vLLM's own choice).

    Raises a one-line error when the setting exceeds the model's limit (vLLM refuses it at the build,
    deep in a validation error)."""
    limit = getattr(config, "max_position_embeddings", None)
    if settings.max_model_len is None:
        return DEFAULT_MAX_MODEL_LEN if limit is None else min(DEFAULT_MAX_MODEL_LEN, limit)
    if limit is not None and settings.max_model_len > limit:
        raise ValueError(f"vllm max_model_len={settings.max_model_len} exceeds the model's limit of {limit} tokens "
                         f"(max_position_embeddings): set it to {limit} or less, or leave it unset")
    return settings.max_model_len


def check_runnable(vllm, config, settings: VLLMSettings) -> None:
    """One line, before the engine's build, for what vLLM's platform cannot do (its own error comes
    from inside its engine, after a minute of loading): sleep mode off a GPU, and on CPU a head size
    its attention kernels do not take."""
    platform = getattr(getattr(vllm, "platforms", None), "current_platform", None)
    if platform is None:  # another release's layout: vLLM says it itself
        return
    if settings.enable_sleep_mode and not platform.is_sleep_mode_available():
        raise ValueError("vllm enable_sleep_mode needs a GPU (vLLM offers sleep on CUDA, ROCm and XPU only): "
                         "leave it false on this machine")
    if not platform.is_cpu():
        return
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend
    except ImportError:
        return
    supported = CPUAttentionBackend.get_supported_head_sizes()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim not in supported:
        raise ValueError(f"vLLM's CPU attention cannot run this model: its head size is {head_dim}, the kernels take "
                         f"{supported}; use --model.rollout_backend hf, or a model with one of those head sizes")


@dataclass(frozen=True)
class EnginePlacement:
    """Where this process's engine goes in the trainer's world.

    local_rank is the index of the trainer's CUDA device: vLLM's worker puts itself on
    ``cuda:<LOCAL_RANK>``, so this is what makes it share the trainer's GPU (it equals the local
    rank under Lightning's default device assignment, and stays right with e.g. ``devices=[2, 3]``).
    """

    rank: int
    local_rank: int
    world_size: int
    distributed_ready: bool
    """True when torch.distributed is already initialized (DDP): vLLM joins that world."""


def placement_for(device: torch.device) -> EnginePlacement:
    """The placement of an engine serving a policy on ``device``, from the trainer's process group."""
    ready = dist.is_available() and dist.is_initialized()
    rank, world_size = (dist.get_rank(), dist.get_world_size()) if ready else (0, 1)
    if device.type == "cuda" and device.index is not None:
        local_rank = device.index
    elif device.type == "cuda" and torch.cuda.is_available():
        local_rank = torch.cuda.current_device()
    else:  # CPU policy: no GPU to share (only the stand-in engine of the tests runs there)
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
    return EnginePlacement(rank=rank, local_rank=local_rank, world_size=world_size, distributed_ready=ready)


def launcher_environment(placement: EnginePlacement) -> dict[str, str]:
    """The variables vLLM's external launcher reads, for this placement."""
    env = {
        "RANK": str(placement.rank),
        "LOCAL_RANK": str(placement.local_rank),
        "WORLD_SIZE": str(placement.world_size),
        # In-process engine: its model is reachable for weight loading (external_launcher sets this
        # too; setting it first keeps it right whatever vLLM cached from the environment).
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    }
    if not placement.distributed_ready:
        # vLLM creates a one-process world through env://; an existing rendezvous is respected.
        env["MASTER_ADDR"] = os.environ.get("MASTER_ADDR") or "localhost"
        port = os.environ.get("MASTER_PORT", "").strip().lower()
        env["MASTER_PORT"] = port if port not in {"", "0", "auto"} else str(_free_port())
    return env


# Left set after the build, as vLLM itself leaves it: later engine calls may read it again.
_KEPT_AFTER_BUILD = ("VLLM_ENABLE_V1_MULTIPROCESSING",)


@contextmanager
def scoped_environment(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` for the block, then restore the previous values (except ``_KEPT_AFTER_BUILD``)."""
    previous = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in previous.items():
            if name in _KEPT_AFTER_BUILD:
                continue
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextmanager
def autocast_off() -> Iterator[None]:
    """No autocast on CUDA or CPU: the engine runs its own dtypes, not the trainer's mixed precision."""
    with torch.autocast("cuda", enabled=False), torch.autocast("cpu", enabled=False):
        yield


@contextmanager
def outside_trainer_contexts() -> Iterator[None]:
    """Run the block under plain torch defaults and undo its effects on the trainer's global state.

    Inside: default dtype float32, default device CPU, no inference mode (engine weights made as
    inference tensors could never be updated by a weight sync), no autocast. Afterwards: the
    default dtype, the Python / NumPy / torch (CPU and CUDA) generators and the current CUDA device
    are what they were before.
    """
    default_dtype = torch.get_default_dtype()
    generators = _generator_states()
    cuda_device = torch.cuda.current_device() if torch.cuda.is_initialized() else None
    matmul_precision = torch.get_float32_matmul_precision()
    frozen_before = gc.get_freeze_count()
    # A device context is a torch function mode that torch.compile (vLLM compiles its model) would
    # trace through: only override one that is active, e.g. Lightning's tensor_init_context.
    device = torch.device("cpu") if torch.get_default_device() != torch.device("cpu") else nullcontext()
    torch.set_default_dtype(torch.float32)
    try:
        with device, torch.inference_mode(False), autocast_off():
            yield
    finally:
        torch.set_default_dtype(default_dtype)
        _restore_generators(generators)
        if cuda_device is not None:
            torch.cuda.set_device(cuda_device)
        torch.set_float32_matmul_precision(matmul_precision)
        if frozen_before == 0 and gc.get_freeze_count() > 0:
            gc.unfreeze()  # the trainer's objects stay collectable (vLLM's own shutdown unfreezes too)


def engine_keywords(settings: VLLMSettings, model_name_or_path: str, seed: int) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for a colocated engine (TRL 1.16's colocate set)."""
    return {
        "model": model_name_or_path,
        "distributed_executor_backend": "external_launcher",  # in-process, one engine per rank
        "tensor_parallel_size": 1,
        "seed": seed,
        "dtype": settings.dtype,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "kv_cache_memory_bytes": None if settings.kv_cache_gib is None else int(settings.kv_cache_gib * 2**30),
        "max_model_len": settings.max_model_len,
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "enable_prefix_caching": settings.enable_prefix_caching,
        "enforce_eager": settings.enforce_eager,
        "enable_sleep_mode": settings.enable_sleep_mode,
        # log-probs after temperature (and top-k/top-p): those of the distribution actually sampled,
        # which is what the importance-sampling correction compares the trainer's with.
        "logprobs_mode": "processed_logprobs",
    }


def build_engine(vllm, settings: VLLMSettings, model_name_or_path: str, seed: int, placement: EnginePlacement):
    """A ``vllm.LLM`` in this process, on the trainer's GPU, leaving the trainer's state as it was."""
    wait_for_every_rank(placement, next(_BUILDS))
    envs = _envs_module(vllm)
    restore_cache = (callable(getattr(envs, "disable_envs_cache", None))
                     and not getattr(envs, "_is_envs_cache_enabled", lambda: True)())
    try:
        with scoped_environment(launcher_environment(placement)), outside_trainer_contexts():
            return vllm.LLM(**engine_keywords(settings, model_name_or_path, seed))
    finally:
        if restore_cache:
            envs.disable_envs_cache()  # environment variables are read afresh again (a later build sees its own)


# How long a rank waits for the others at an engine build before saying why it would hang.
RANK_JOIN_TIMEOUT_S = 600.0
_BUILDS = itertools.count()  # every rank builds the same engines in the same order: the n-th build's key


def wait_for_every_rank(placement: EnginePlacement, build_index: int, store=None,
                        timeout_s: float | None = None) -> None:
    """Return once every rank of the trainer's world has reached this engine build; raise if they do not.

    The build is a collective over all ranks: one rank building alone (a generate under
    ``if trainer.is_global_zero``, an eval on rank 0 only) would block in it forever. The ranks
    meet through the process group's key-value store instead, which can time out.
    """
    if not placement.distributed_ready or placement.world_size == 1:
        return
    store = store if store is not None else _default_store()
    if store is None:
        return
    timeout_s = RANK_JOIN_TIMEOUT_S if timeout_s is None else timeout_s
    key = f"rlcode/vllm_engine_build/{build_index}"
    store.add(key, 1)
    deadline = time.monotonic() + timeout_s
    while (arrived := store.add(key, 0)) < placement.world_size:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"Only {arrived} of {placement.world_size} ranks reached the vLLM engine build within {timeout_s:.0f} s: "
                "the build is a collective over all ranks, so generating on some ranks only would hang. Call "
                "generate on every rank (not under `if trainer.is_global_zero`), or use the 'hf' rollout backend.")
        time.sleep(0.05)


def _default_store():
    """The default process group's store, or None (no group, or a torch without one)."""
    try:
        from torch.distributed.distributed_c10d import _get_default_store

        return _get_default_store()
    except (ImportError, RuntimeError, ValueError, AttributeError):
        return None


def _envs_module(vllm):
    """``vllm.envs`` (its environment-variable cache), or None where there is none."""
    import importlib

    try:
        return importlib.import_module(f"{vllm.__name__}.envs")
    except ImportError:
        return getattr(vllm, "envs", None)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _generator_states() -> dict[str, Any]:
    import random

    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy

        states["numpy"] = numpy.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _restore_generators(states: dict[str, Any]) -> None:
    import random

    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
