"""Hardware detection and the training defaults it implies.

Kept separate from the training code so the choices (precision above all) are unit-testable with a
made-up `PlatformInfo` on a machine without a GPU.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

_SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOBID")


@dataclass(frozen=True)
class PlatformInfo:
    """What the process can run on.

    Args:
        device_type: "cuda" or "cpu".
        gpu_name: name of GPU 0, or None on CPU.
        gpu_count: number of visible GPUs.
        compute_capability: (major, minor) of GPU 0, or None on CPU.
        gpu_memory_bytes: total memory of GPU 0, or None on CPU.
        cpu_count: CPUs this process may use (affinity, not the machine's total).
        slurm_job_id: the SLURM job id when running inside a SLURM allocation.
        slurm_environment: the SLURM_* variables that shape the launch (tasks, nodes, GPUs).
        torch_arch_list: ``torch.cuda.get_arch_list()`` of the installed build (empty on CPU).
        torch_version: ``torch.__version__``.
    """

    device_type: str = "cpu"
    gpu_name: str | None = None
    gpu_count: int = 0
    compute_capability: tuple[int, int] | None = None
    gpu_memory_bytes: int | None = None
    cpu_count: int = 1
    slurm_job_id: str | None = None
    slurm_environment: dict[str, str] = field(default_factory=dict)
    torch_arch_list: tuple[str, ...] = ()
    torch_version: str = ""

    @property
    def in_slurm(self) -> bool:
        return self.slurm_job_id is not None

    def describe(self) -> str:
        """One line for logs."""
        if self.device_type == "cuda":
            major, minor = self.compute_capability or (0, 0)
            memory_gb = (self.gpu_memory_bytes or 0) / 2**30
            device = f"{self.gpu_count} x {self.gpu_name} (sm_{major}{minor}, {memory_gb:.0f} GiB)"
        else:
            device = f"CPU ({self.cpu_count} cores)"
        return device + (f", SLURM job {self.slurm_job_id}" if self.in_slurm else "")


def detect_platform() -> PlatformInfo:
    """Inspect the visible devices and the environment."""
    import torch  # about 1.3 s: `import rlcode.platform` stays light (tests/test_models.py checks)

    cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    slurm_job_id = next((os.environ[name] for name in _SLURM_VARIABLES if name in os.environ), None)
    slurm_environment = {key: value for key, value in os.environ.items() if key.startswith("SLURM_")}
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return PlatformInfo(
            cpu_count=cpu_count, slurm_job_id=slurm_job_id, slurm_environment=slurm_environment
        )
    properties = torch.cuda.get_device_properties(0)
    return PlatformInfo(
        device_type="cuda",
        gpu_name=properties.name,
        gpu_count=torch.cuda.device_count(),
        compute_capability=(properties.major, properties.minor),
        gpu_memory_bytes=properties.total_memory,
        cpu_count=cpu_count,
        slurm_job_id=slurm_job_id,
        slurm_environment=slurm_environment,
        torch_arch_list=tuple(torch.cuda.get_arch_list()),
        torch_version=torch.__version__,
    )


# ---- the torch build: does it hold kernels for this GPU? ----------------------------------------------
# PyPI's Linux torch wheel is a CUDA 13 build, and CUDA 13 dropped everything before Turing (sm_75):
# on a V100 (sm_70) it imports fine and fails at the first kernel. PyTorch's cu126 builds keep sm_50+.
CU126_INDEX = "https://download.pytorch.org/whl/cu126"
_OLDEST_CUDA13_GPU = (7, 5)


def _parse_arch(entry: str) -> tuple[str, tuple[int, int], str] | None:
    """``"sm_90a"`` -> ("sm", (9, 0), "a"): kind, (major, minor), suffix (the last digit is the minor)."""
    kind, _, rest = entry.partition("_")
    suffix = rest[-1] if rest[-1:] in ("a", "f") else ""
    digits = rest[: len(rest) - len(suffix)]
    if kind not in ("sm", "compute") or len(digits) < 2 or not digits.isdigit():
        return None
    return kind, (int(digits[:-1]), int(digits[-1])), suffix


def build_runs_on(arch_list, capability: tuple[int, int]) -> bool:
    """Whether a build compiled for ``arch_list`` runs on a GPU of ``capability``.

    A binary for sm_XY runs on sm_XZ with Z >= Y (same major) and an ``f`` (family) binary likewise;
    an ``a`` (architecture-specific) binary only on its own GPU. PTX (``compute_XY``) is compiled
    by the driver for any GPU from XY on, so a build with PTX older than the GPU still runs (slowly
    at first).
    """
    for entry in arch_list:
        parsed = _parse_arch(entry)
        if parsed is None:
            continue
        kind, arch, suffix = parsed
        if suffix == "a" and arch == capability:
            return True
        if suffix != "a" and kind == "sm" and arch[0] == capability[0] and arch[1] <= capability[1]:
            return True
        if suffix == "" and kind == "compute" and arch <= capability:
            return True
    return False


def torch_build_problem(info: PlatformInfo) -> str | None:
    """One line saying which torch build to install when the installed one lacks this GPU's
    architecture; None when it runs here (or on CPU, or when the build lists no architectures)."""
    if info.device_type != "cuda" or not info.compute_capability or not info.torch_arch_list:
        return None
    capability = info.compute_capability
    if build_runs_on(info.torch_arch_list, capability):
        return None
    major, minor = capability
    have = f"torch {info.torch_version} has no kernels for {info.gpu_name} (sm_{major}{minor}; it holds " \
           f"{' '.join(info.torch_arch_list)})"
    version = info.torch_version.split("+")[0]
    if capability < _OLDEST_CUDA13_GPU:
        return (f"{have}: install the CUDA 12.6 build: pip install 'torch=={version}+cu126' --extra-index-url "
                f"{CU126_INDEX}")
    return f"{have}: install a torch build for sm_{major}{minor} (https://pytorch.org/get-started/locally/)"


def supports_bf16(info: PlatformInfo) -> bool:
    """bf16 only from Ampere (sm_80) on.

    `torch.cuda.is_bf16_supported()` says yes on V100 too, where bf16 is emulated and slow.
    """
    return info.device_type == "cuda" and info.compute_capability is not None and info.compute_capability[0] >= 8


def default_precision(info: PlatformInfo) -> str:
    """The Lightning precision string to train with on this platform.

    bf16-mixed on sm_80+, 16-mixed (fp16 with loss scaling) on older GPUs such as V100 (sm_70),
    32-true on CPU (CPU autocast to bf16 is slower than fp32 for small models).
    """
    if info.device_type != "cuda":
        return "32-true"
    return "bf16-mixed" if supports_bf16(info) else "16-mixed"


def precision_for(info: PlatformInfo, sharded: bool) -> tuple[str, str]:
    """(precision, why) for an unset ``trainer.precision``: ``default_precision``, except 32-true for
    FSDP (``sharded``) on a GPU without bf16 (FSDP2 under Lightning does no fp16 loss scaling:
    rlcode.models.sharding.precision_policy)."""
    chosen = default_precision(info)
    if chosen == "16-mixed" and sharded:
        return "32-true", "chosen for FSDP on a GPU without bf16"
    return chosen, "chosen for this hardware"


def default_sandbox_workers(local_ranks: int = 1, info: PlatformInfo | None = None) -> int:
    """Sandbox worker processes for one rank: the node's cores shared among its ranks.

    Every rank of a DDP run starts its own pool; one worker per core on each of N local ranks would
    run N programs per core and time honest ones out.
    """
    cores = (info or _cpu_only_platform()).cpu_count
    return max(1, cores // max(1, local_ranks))


def _cpu_only_platform() -> PlatformInfo:
    cpu_count = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return PlatformInfo(cpu_count=cpu_count)


def default_eval_batch_size(device_type: str) -> int:
    """Problems generated together by a greedy MBPP eval when the config does not say.

    On CPU a decoding row costs far less at batch 8-16 than at 1-2 (a step's weights are read once for
    every row in it), and beyond that a step is compute-bound while padding grows: batch 32 was slower
    per problem than 16 (a dated run, benchmarks/journal/sandbox.md, "Eval speed"). A GPU is far from busy at 16; 32 is the
    largest eval batch of the configs/hw overlays, whose memory shares were sized beside training.
    """
    return 32 if device_type == "cuda" else 16


# ---- platform profiles: what a GPU kind changes beyond precision ---------------------------------------
# Sized for the 1.5B MBPP recipes (Qwen2.5-1.5B, prompts up to ~350 tokens + 512 new tokens); the memory
# arithmetic is in docs/configs.md ("Platform profiles"). configs/hw/*.yaml hold the same values for users
# who prefer explicit files (tests/test_platform_profile.py keeps them equal). Keys are config keys as
# written on the command line (``--model.micro_batch_size 2``).
_PROFILES: dict[str, dict] = {
    # Under 30 GiB or before sm_80 (V100 16/32 GB, T4, 24 GB cards): the fp32 master weights, grads and
    # AdamW states of 1.5B parameters (25 GB) leave little beside them, so small micro-batches with
    # recomputation; slow fp16 GPUs also evaluate on fewer problems.
    "v100": {"model.micro_batch_size": 2, "model.gradient_checkpointing": True,
             "model.vllm.gpu_memory_utilization": 0.25, "eval.batch_size": 8, "eval.num_questions": 10},
    # sm_80+ with 30 GiB or more (A100 40/80 GB, L40S, A6000, smaller sm_90 cards). On 40 GB the states
    # (28 GB) and 4 recomputed rows leave 13 GB: a colocated vLLM engine awake beside them gets 0.25 of it.
    "a100": {"model.micro_batch_size": 4, "model.gradient_checkpointing": True,
             "model.vllm.gpu_memory_utilization": 0.25, "eval.batch_size": 16, "eval.num_questions": 20},
    # sm_90+ with 70 GiB or more (H100, H200, B200): room to skip recomputation (about 13% of a step):
    # 8 full-length rows keep 24 GB, so 52 GB with the states, and 0.3 of 85 GB for vLLM on top.
    "h100": {"model.micro_batch_size": 8, "model.gradient_checkpointing": False,
             "model.vllm.gpu_memory_utilization": 0.3, "eval.batch_size": 32, "eval.num_questions": 20},
}
PROFILE_LABELS = {"v100": "V100-class (before sm_80 or under 30 GiB)", "a100": "A100-class (sm_80+, 30 GiB+)",
                  "h100": "H100-class (sm_90+, 70 GiB+)"}


def profile_kind(info: PlatformInfo) -> str | None:
    """"v100", "a100" or "h100" (the configs/hw overlay with this GPU's values), None on CPU.

    Memory decides how much fits; the compute capability says how fast and in which precision.
    An A100 80 GB stays A100-class (sm_80): the overlay for it says 40 or 80 GB.
    """
    if info.device_type != "cuda":
        return None
    major = (info.compute_capability or (0, 0))[0]
    memory_gib = (info.gpu_memory_bytes or 0) / 2**30
    if major < 8 or memory_gib < 30:
        return "v100"
    if major >= 9 and memory_gib >= 70:
        return "h100"
    return "a100"


# A GPU kind to preview from a machine without it (``--run.platform_profile h100x4 --print_config``): the
# typical card of each class, as torch reports it (an "80 GB" card shows ~79 GiB).
PREVIEW_GPUS = {"v100": ("Tesla V100-SXM2-32GB", (7, 0), 31.7), "a100": ("NVIDIA A100-SXM4-80GB", (8, 0), 79.2),
                "h100": ("NVIDIA H100 80GB HBM3", (9, 0), 79.1)}


def preview_platform(name: str, here: PlatformInfo) -> PlatformInfo:
    """``here`` as if it had the GPUs ``name`` says: a kind of ``PREVIEW_GPUS``, optionally ``xN`` GPUs
    (``h100``, ``a100x4``). Raises ValueError naming what is accepted."""
    match = re.fullmatch(r"(v100|a100|h100)(?:x([1-9][0-9]{0,2}))?", name.strip().lower())
    if match is None:
        raise ValueError(f"run.platform_profile {name!r} is not a GPU to preview: use v100, a100 or h100, with "
                         "xN for N GPUs (h100x4), or true (the GPU here) / off")
    gpu_name, capability, memory_gib = PREVIEW_GPUS[match.group(1)]
    return replace(here, device_type="cuda", gpu_name=f"{gpu_name} (preview)", gpu_count=int(match.group(2) or 1),
                   compute_capability=capability, gpu_memory_bytes=int(memory_gib * 2**30), torch_arch_list=())


def profile_for(info: PlatformInfo) -> dict:
    """The settings this platform's profile chooses, as config keys (empty on CPU)."""
    kind = profile_kind(info)
    return dict(_PROFILES[kind]) if kind else {}


# ---- sharding: DDP or FSDP on several GPUs -----------------------------------------------------------------
# A full fine-tune keeps, per parameter, an fp32 master weight, its fp32 gradient and AdamW's two fp32
# moments (bf16-mixed keeps fp32 weights and computes in bf16). Under LoRA the base is frozen (no
# gradient, no optimizer state; fp32 weights, or 0.5 / 1 byte quantized) and the adapters are small.
BYTES_PER_TRAINED_PARAMETER = 16
BYTES_PER_FROZEN_PARAMETER = {None: 4, "4bit": 0.5, "8bit": 1}
# The share of one GPU the training state may fill before DDP stops fitting: the rest holds the
# activations of a micro-batch, generation's KV cache, the reference and the allocator's slack.
STATE_SHARE = 0.6


def training_state_bytes(parameters: int, lora: bool = False, quantization: str | None = None) -> int:
    """Weights + gradients + AdamW state of one unsharded copy of a model of ``parameters``."""
    if lora:
        return int(parameters * BYTES_PER_FROZEN_PARAMETER.get(quantization, 4))
    return parameters * BYTES_PER_TRAINED_PARAMETER


def sharding_choice(info: PlatformInfo, state_bytes: int) -> tuple[str, str] | None:
    """("ddp" or "fsdp", why) on several GPUs: FSDP when one copy of the training state does not fit in
    ``STATE_SHARE`` of one GPU; None on one GPU or the CPU (nothing to choose)."""
    if info.device_type != "cuda" or info.gpu_count < 2 or not info.gpu_memory_bytes:
        return None
    share = STATE_SHARE * info.gpu_memory_bytes
    sizes = f"training state {state_bytes / 2**30:.1f} GiB, {STATE_SHARE:.0%} of one GPU {share / 2**30:.1f} GiB"
    if state_bytes > share:
        return "fsdp", f"{sizes}: sharded over {info.gpu_count} GPUs"
    return "ddp", f"{sizes}: a whole copy per GPU fits"
