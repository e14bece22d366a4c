"""What a training module asks of the run it is in: sandbox pools sized for this rank and with the
mode's isolation settings, the stop strings of the data's prompt format, the trainer's precision.

A mixin of ``Learner``: it reads ``hparams`` (``stop``, ``precision``), the mode's ``sandbox``
settings and the attached trainer, if any.
"""

from __future__ import annotations

from typing import Annotated

from dataclasses import dataclass

from rlcode.data.prompts import STOP_SEQUENCES
from rlcode.platform import default_sandbox_workers
from rlcode.rollout import SamplingParams
from rlcode.sandbox import SandboxPool
from rlcode.setting import COUNT, field_of


@dataclass(frozen=True)
class SandboxSettings:
    """How a mode that runs code runs it (``model.mode.init_args.sandbox``)."""

    workers: Annotated[int, field_of(COUNT)] | None = None
    """Sandbox worker processes (None: the CPU cores shared among the node's ranks)."""
    allow_visible_filesystem: bool = False
    """Score untrusted code even where no isolation layer hides your files from it (no bubblewrap,
    user namespaces or Landlock); see docs/sandbox.md."""


class RunContext:
    def sandbox_pool(self, timeout: float, workers: int | None = None):
        """A sandbox pool for this rank with the mode's sandbox settings (the caller closes it)."""
        settings = self.mode.sandbox or SandboxSettings()
        return SandboxPool(workers=workers or self.sandbox_workers(), timeout=timeout,
                           allow_visible_filesystem=settings.allow_visible_filesystem)

    def sandbox_workers(self) -> int:
        """Workers of this rank's sandbox pool: as configured, else the node's cores over its ranks."""
        local_ranks = self._trainer.num_devices if self._trainer is not None else 1
        return (self.mode.sandbox or SandboxSettings()).workers or default_sandbox_workers(local_ranks)

    def stop_strings(self) -> list[str]:
        """``stop``, or (None) the stop strings of the DataModule's prompt format."""
        if self.hparams.stop is not None:
            return list(self.hparams.stop)
        datamodule = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        return list(STOP_SEQUENCES.get(getattr(datamodule, "prompt_format", None), []))

    def _training_precision(self) -> str:
        """The trainer's precision string when attached (it decides autocast), else ``precision``."""
        return str(self._trainer.precision) if self._trainer is not None else str(self.hparams.precision)

    def sampling_params(self, seed: int | None, temperature: float | None = None, max_new_tokens: int | None = None):
        """The run's sampling settings with ``seed`` (``temperature``, ``max_new_tokens``: the training
        ones unless given)."""
        hp = self.hparams
        return SamplingParams(temperature=hp.temperature if temperature is None else temperature, top_p=hp.top_p,
                              top_k=hp.top_k, max_new_tokens=max_new_tokens or hp.max_new_tokens,
                              stop=self.stop_strings(), seed=seed)
