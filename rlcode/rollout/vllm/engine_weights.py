"""Whether an inference engine's copy of the weights is the policy's current one, and whether it sleeps.

An engine that holds its own copy of the weights (vLLM) must be given the policy's weights before it
generates, but only when they changed: a full push costs seconds on a large model, and the MBPP eval
alone calls generate many times between two optimizer steps. As TRL keys its sync on the step, this
keys it on a version the trainer bumps whenever the weights change: after an optimizer step and when
a checkpoint is loaded (which covers ``rlcode validate/test --ckpt_path`` and the eval callback's
at-start eval on a resumed run, which comes before any step).

The engine starts as never synced: what it loaded from disk is the model before any checkpoint or
adapter, so the first generate always pushes the policy's weights.

Sleep (vLLM's level 2) discards the engine's weights and KV cache: after it, the weights must be
pushed again whatever the version says.
"""

from __future__ import annotations


class EngineWeights:
    def __init__(self) -> None:
        self.policy_version = 0
        self.engine_version: int | None = None  # None: never pushed
        self.weights_asleep = False
        self.kv_cache_asleep = False

    def policy_changed(self) -> None:
        """The trainer changed the policy's weights (optimizer step, checkpoint load)."""
        self.policy_version += 1

    @property
    def stale(self) -> bool:
        """The engine must be given the policy's weights before its next generate."""
        return self.weights_asleep or self.engine_version != self.policy_version

    def pushed(self) -> None:
        """The policy's current weights are now in the engine."""
        self.engine_version = self.policy_version

    def slept(self) -> None:
        """Level 2 sleep: weights and KV cache discarded."""
        self.weights_asleep = self.kv_cache_asleep = True
        self.engine_version = None

    def weights_woken(self) -> None:
        self.weights_asleep = False

    def kv_cache_woken(self) -> None:
        self.kv_cache_asleep = False
