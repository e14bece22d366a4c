"""The reference policy of the KL term (``beta`` > 0): the starting policy, and its log-probs of a rollout.

Full fine-tuning keeps a frozen copy, taken before any checkpoint is restored, so the reference stays
the starting policy. It is held off the module tree (``object.__setattr__``: ``nn.Module`` would
register it as a submodule, and every checkpoint would carry a second copy of the weights), and it is
only ever run forward, so it is kept in the compute dtype (bf16 under bf16-mixed: half the memory of
the fp32 master weights). Under LoRA no copy is made: the base with its adapters off is the reference.

A mixin of ``Learner``: it reads ``hparams`` (``beta``, ``temperature``, ``micro_batch_size``,
``share_prefix``), ``self.policy`` and the trainer's precision.
"""

from __future__ import annotations

import copy

from rlcode.logprobs.sequence_logps import batched_completion_logps
from rlcode.models import compute_dtype, is_lora_model, reference_mode


class KLReference:
    """Uses ``self._reference``: the frozen copy (full fine-tuning with beta != 0), else None."""

    def _keep_reference(self) -> None:
        """Copy the policy as the reference when the KL term needs one and adapters cannot serve."""
        if self.hparams.beta != 0.0 and not is_lora_model(self.policy):
            reference = copy.deepcopy(self.policy).requires_grad_(False).eval()
            object.__setattr__(self, "_reference", reference.to(compute_dtype(self._training_precision())))

    def _reference_logps(self, rollout):
        """[B, C] log-probs of the rollout's completions under the reference, without gradients."""
        hp = self.hparams
        model = self._reference if self._reference is not None else self.policy

        def logps():
            return batched_completion_logps(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                            rollout.completion_mask, hp.temperature, hp.micro_batch_size,
                                            share_prefix=hp.share_prefix)
        if self._reference is not None:
            return logps()
        with reference_mode(self.policy):  # LoRA: the base without adapters is the reference
            return logps()
