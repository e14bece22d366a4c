"""The policy's optimizer: torch's AdamW, or bitsandbytes' 8-bit AdamW.

AdamW keeps two fp32 moments per trained parameter: 8 bytes, twice the fp32 weights' 4 and the
largest part of a full fine-tune's state (a 1.5B model: 12 GB of its 24 GB). bitsandbytes' 8-bit
AdamW stores each moment as one byte per element with a block-wise scale (blocks of 256 elements,
dynamic quantisation; tensors under 4,096 elements stay fp32), about 2 bytes per parameter instead
of 8, with the update computed in fp32. It runs on CUDA and, in bitsandbytes >= 0.48, on the CPU.

Not under FSDP: its quantised states are per-tensor buffers bitsandbytes does not shard (the
parameters there are DTensors), so a sharded run with it is refused in one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch

from rlcode.errors import SettingError

OptimizerName = Literal["adamw", "adamw_8bit"]


def build_optimizer(name: OptimizerName, params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float,
                    sharded: bool) -> torch.optim.Optimizer:
    """The named optimizer over ``params``."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if name != "adamw_8bit":
        raise SettingError(f"model.optimizer={name!r} is not known: use adamw or adamw_8bit")
    if sharded:
        raise SettingError("model.optimizer=adamw_8bit cannot run under --trainer.strategy fsdp (bitsandbytes does "
                           "not shard its 8-bit states): use model.optimizer adamw, or strategy ddp")
    try:
        import bitsandbytes
    except ImportError as error:
        raise SettingError(f"model.optimizer=adamw_8bit needs bitsandbytes ({error}): pip install "
                           "'bitsandbytes>=0.48', or use model.optimizer adamw") from error
    return bitsandbytes.optim.AdamW8bit(params, lr=lr, weight_decay=weight_decay)
