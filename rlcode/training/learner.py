"""The one LightningModule: the policy, its tokenizer and rollout backend, the reference, the loss
and the update, driven by a training mode (``rlcode.training.mode.Mode``).

    mode.collect -> reference log-probs (overlapping the rewards) -> rewards -> flat rows
                 -> all-rank totals -> the mode's advantages -> rows to train -> update_policy

Manual optimization, because one batch of prompts is a whole RL iteration: generation, scoring and
``num_iterations`` optimizer steps over the same rollouts. Everything a callback may want to log is
left in ``self.last_step`` (a StepRecord) and ``self.history`` (a RunHistory); the module logs nothing itself
during training.

The model, tokenizer and rollout backend are built in ``configure_model`` (so ``--print_config`` and
tests of the config surface stay light) and kept on ``self``, outside the hyperparameters. Dropout is
off in the policy (as TRL's ``disable_dropout``): the log-probs of the loss must be those of the
policy that sampled, which generates in eval mode.

Distributed: DDP or FSDP2 (``--trainer.strategy fsdp``: ``rlcode.training.fsdp_strategy``). Each rank
trains on its own prompts (the DataModule shards them), gradients are all-reduced (DDP) or
reduce-scattered (FSDP) once per optimizer update, and the ranks agree, in one all-reduce per step, on
the loss normalisers, the batch reward std and whether to update (``rlcode.training.all_ranks_totals``),
so a 2-rank step equals a 1-rank step on the combined batch. Under FSDP ``configure_model`` shards the
policy (and the reference, and any frozen copy a mode takes) after loading it
(``rlcode.models.sharding``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

import lightning as L
import torch

from rlcode.algorithms.losses import ImportanceSamplingLevel, LossType, mask_truncated
from rlcode.models import disable_dropout, is_lora_model, load_model, load_tokenizer
from rlcode.models.adapters import LoraSettings, Quantization
from rlcode.models.sharding import (ShardingPlan, is_rank_zero, is_sharded, reshard, shard_from_rank_zero,
                                    sharding_plan)
from rlcode.models.user_model import from_pretrained_model
from rlcode.rollout.backends import build_backend
from rlcode.rollout.openai.client import OpenAISettings, ServedModelError
from rlcode.rollout.quantized_sampler import precision_refusal
from rlcode.rollout.vllm.engine import VLLMSettings
from rlcode.run_dir.identity import shared_run_id
from rlcode.setting import (COUNT, COUNT_OR_ZERO, FRACTION_BELOW_ONE, NON_NEGATIVE, POSITIVE, SEED, Range,
                            check_arguments, fixed, free)
from rlcode.stopping import StopPoint, Stopped, StopToken
from rlcode.training.all_ranks_totals import Ranks, sum_over_ranks
from rlcode.training.device_memory import peak_memory_gib, reset_peak_memory
from rlcode.training.fsdp_strategy import sharding_refusal
from rlcode.training.gradient_sync import clip_grad_norm, no_gradient_sync
from rlcode.training.kl_reference import KLReference
from rlcode.training.mode import Mode
from rlcode.training.optimizer_steps import count_step_without_update, update
from rlcode.training.optimizers import OptimizerName, build_optimizer
from rlcode.training.policy_rollouts import PolicyRollouts
from rlcode.training.policy_update import TrainerHooks, UpdateSettings, update_policy
from rlcode.training.resume_state import ExactResume
from rlcode.training.run_context import RunContext
from rlcode.training.run_history import RunDescription, RunHistory
from rlcode.training.step_abandon import abandon, step_start
from rlcode.training.step_record import StepRecord, timed
from rlcode.training.step_scalars import success_labels

if TYPE_CHECKING:
    from rlcode.rollout.base import RolloutBatch


class Learner(ExactResume, RunContext, PolicyRollouts, KLReference, L.LightningModule):
    def __init__(
        self,
        mode: Annotated[Mode, fixed()],
        model_name: Annotated[str, fixed()] = "smollm2-135m-instruct",
        precision: Annotated[str, free()] = "32-true",
        gradient_checkpointing: Annotated[bool, free()] = False,
        lora: Annotated[LoraSettings, fixed()] | None = None,
        quantization: Annotated[Quantization, fixed()] | None = None,
        disable_dropout: Annotated[bool, fixed()] = True,
        max_new_tokens: Annotated[int, fixed(COUNT)] = 256,
        temperature: Annotated[float, fixed(POSITIVE)] = 0.7,
        top_p: Annotated[float, fixed(Range(0, 1, low_open=True))] = 1.0,
        top_k: Annotated[int, fixed(COUNT_OR_ZERO)] = 0,
        stop: Annotated[list[str], fixed()] | None = None,
        generation_seed: Annotated[int, fixed(SEED)] = 0,
        rollout_backend: Annotated[Literal["hf", "vllm", "openai"], free()] = "hf",
        rollout_precision: Annotated[Literal["same", "int8"], free()] = "same",
        vllm: Annotated[VLLMSettings, free()] | None = None,
        openai: Annotated[OpenAISettings, free()] | None = None,
        learning_rate: Annotated[float, fixed(POSITIVE)] = 1e-6,
        weight_decay: Annotated[float, fixed(NON_NEGATIVE)] = 0.0,
        optimizer: Annotated[OptimizerName, fixed()] = "adamw",
        loss_type: Annotated[LossType, fixed()] = "dapo",
        beta: Annotated[float, fixed(NON_NEGATIVE)] = 0.0,
        epsilon_low: Annotated[float, fixed(FRACTION_BELOW_ONE)] = 0.2,
        epsilon_high: Annotated[float, fixed(NON_NEGATIVE)] = 0.2,
        importance_sampling_level: Annotated[ImportanceSamplingLevel, fixed()] = "token",
        num_iterations: Annotated[int, fixed(COUNT)] = 1,
        micro_batch_size: Annotated[int, free(COUNT)] = 8,
        micro_batch_tokens: Annotated[int, free(COUNT)] | None = None,
        share_prefix: Annotated[bool, free()] = True,
        skip_zero_advantage_rows: Annotated[bool, free()] = False,
        mask_truncated_completions: Annotated[bool, fixed()] = False,
        max_grad_norm: Annotated[float, fixed(POSITIVE)] | None = 1.0,
        dry_run: Annotated[bool, fixed()] = False,
    ) -> None:
        """The policy and its update, for any training mode.

        Args:
            mode: the training mode and its settings (``rlcode.modes``: GRPO, SPIRAL, MultiStepMBPP,
                CodeGame; in a config ``model.mode: {class_path: ..., init_args: ...}``).
            model_name: short name ("smollm2-135m-instruct", "tiny-random"), local folder or hub id.
            precision: weight precision as a Lightning string ("32-true", "bf16-true", ...).
            gradient_checkpointing: recompute activations in backward (less memory, slower: the forward runs twice).
            lora: train LoRA adapters instead of every weight; the adapter-free base is then the
                reference policy of the KL term.
            quantization: "4bit" (QLoRA: NF4, double quantization, compute dtype from ``precision``)
                or "8bit" base weights through transformers' BitsAndBytesConfig; needs ``lora``.
            disable_dropout: turn every dropout of the policy off (TRL's default): with dropout on,
                the scored log-probs are not those of the sampling policy and the ratio is noise.
            max_new_tokens: generation limit per completion (per turn in multi-turn modes).
            temperature: sampling temperature (also used to score tokens, as TRL does).
            top_p: nucleus sampling mass (1.0: off).
            top_k: sample from the k most likely tokens (0: off).
            stop: strings that end a completion early (None: those of the data's prompt format,
                the closing code fence for chat, ``[DONE]`` for the MBPP paper's plain format).
            generation_seed: base seed of sampling; each step draws from (seed, step, rank), so a
                resumed run samples what the uninterrupted one would have.
            rollout_backend: "hf" (transformers in this process), "vllm" (colocated engine on the
                same GPU, given the weights before a generate whenever they changed) or "openai" (a
                model behind an OpenAI-compatible server; with ``dry_run`` no local weights load).
            rollout_precision: "same" (sample from the policy) or "int8" (hf backend, CPU: sample from an
                int8 copy rebuilt after every update, ``perf/sampler_refresh_s``; the loss is weighted by
                the truncated importance ratio policy/sampler, cap 3; ``rlcode.rollout.quantized_sampler``).
            vllm: the vLLM engine's settings (``rlcode.rollout.vllm.engine.VLLMSettings``); None: defaults.
            openai: the server's settings (``rlcode.rollout.openai.client.OpenAISettings``: base URL,
                model, api, concurrency, retries; the key only from the environment); None: defaults.
            learning_rate: AdamW learning rate.
            weight_decay: AdamW weight decay.
            optimizer: "adamw" (torch) or "adamw_8bit" (bitsandbytes: moments in 8 bits, about 2 bytes
                per trained parameter instead of 8; not under FSDP; ``rlcode.training.optimizers``).
            loss_type: "dapo" (token-level, TRL's default), "grpo", "bnpo" or "dr_grpo".
            beta: weight of the KL penalty to the reference policy (0: no reference model).
            epsilon_low: lower clip range of the importance ratio.
            epsilon_high: upper clip range (DAPO's clip-higher uses 0.28).
            importance_sampling_level: "token" (GRPO) or "sequence" (GSPO).
            num_iterations: optimizer steps per batch of rollouts (PPO-style reuse; >1 stores
                old log-probs so the clip acts).
            micro_batch_size: rows per forward/backward pass; gradients accumulate over the whole
                step before each optimizer step.
            micro_batch_tokens: also cap a training micro-batch's tokens (each distinct prompt once
                plus the completions; a longer row runs alone): memory follows tokens, not rows, in the
                packed pass. None: rows only.
            share_prefix: run each micro-batch as one packed sequence, each prompt prefix its rows
                share (a group's prompt, an episode's history) once and every completion after it:
                same log-probs and gradients, fewer tokens, one decoder call
                (``rlcode.logprobs.packed_pass``).
            skip_zero_advantage_rows: skip the backward pass of rows whose advantage is exactly 0 (a
                group whose rewards are all equal, a turn whose return equals its baseline): a pure
                speed-up, the update is the same, and the loss normalisers still count them (with
                beta > 0 nothing is skipped, since the KL term of such rows has a gradient).
            mask_truncated_completions: leave completions that hit max_new_tokens out of the loss.
            max_grad_norm: clip the gradient norm before each optimizer step (None: no clipping).
            dry_run: generate and score, but never update the weights (checks a setup end to end;
                steps are still counted, so max_steps ends it).
        """
        super().__init__()
        if not isinstance(mode, Mode):
            raise TypeError(f"mode must be a training mode (rlcode.modes: GRPO, SPIRAL, MultiStepMBPP, CodeGame), "
                            f"got {type(mode).__name__}")
        if quantization is not None and lora is None:  # frozen quantized weights: only adapters can train
            raise ValueError(f"model.quantization={quantization!r} needs model.lora, e.g. --model.lora '{{r: 16}}'")
        refusal = precision_refusal(rollout_precision, rollout_backend, quantization)
        if refusal is not None:
            raise ValueError(refusal)
        check_arguments(Learner, locals(), prefix="model.")  # Python callers; the CLI checked before building
        self.save_hyperparameters(ignore=["mode"])
        self.hparams["mode"] = mode.config()  # plain data: checkpoints name the mode and its settings
        self.mode = mode
        self.automatic_optimization = False
        self.policy = None
        self.tokenizer = None
        self.backend = None
        self.last_step: StepRecord | None = None
        self.last_grad_norm: float | None = None
        self.history = RunHistory()  # every step's scalars, evals, how the run ended: what callbacks show
        self._reference = None  # a frozen copy, kept off the module tree (not saved, not optimized)
        self.sharding_plan: ShardingPlan | None = None  # FSDP: set in configure_model
        self.run_id: str | None = None  # tags this run's sandbox executions (set by the CLI, else made up)
        self.abandoned_step_rng: dict | None = None  # a step given up on a stop signal: its starting RNG states
        self.stop_token = StopToken()  # told of signals by the GracefulShutdown callback (rlcode.stopping)

    from_pretrained_model = classmethod(from_pretrained_model)  # Learner.from_pretrained_model(model, tokenizer, mode=...)

    # ---- building (lazily, once) ------------------------------------------------------------
    def configure_model(self) -> None:
        if self.backend is not None:
            return
        hp = self.hparams
        if self.served_dry_run():
            self._configure_served_dry_run()
            self.mode.configure(self)
            return
        # FSDP's plan (a device mesh from FSDP2Strategy), before any copy: frozen copies are sharded alike
        self.sharding_plan = sharding_plan(self._device_mesh, self._training_precision(), hp.quantization)
        if self.policy is None:  # else handed in by from_pretrained_model, with its tokenizer
            self.tokenizer = load_tokenizer(hp.model_name)
            lora = LoraSettings(**hp.lora) if isinstance(hp.lora, dict) else hp.lora  # hparams may hold a dict
            # Sharded, only rank 0 reads the weights; the others build the model empty and take its slices
            weights = self.sharding_plan is None or is_rank_zero(self.sharding_plan)
            self.policy = load_model(hp.model_name, precision=hp.precision, quantization=hp.quantization,
                                     gradient_checkpointing=hp.gradient_checkpointing, lora=lora, weights=weights)
        if hp.disable_dropout:
            disable_dropout(self.policy)
        self.policy.train()  # from_pretrained returns eval mode; generation switches back and forth itself
        self._keep_reference()  # the KL term's starting policy, copied before any checkpoint is restored
        if is_lora_model(self.policy):
            self.strict_loading = False  # checkpoints hold only the adapters (see on_save_checkpoint)
        self.backend = build_backend(hp.rollout_backend, self.policy, self.tokenizer, hp.model_name,
                                     vllm=hp.vllm, seed=hp.generation_seed, openai=hp.openai, stop_token=self.stop_token,
                                     rollout_precision=hp.get("rollout_precision", "same"))
        self.mode.configure(self)  # e.g. a frozen copy of the starting policy to play against
        if self.sharding_plan is not None:  # in place, after every copy was taken from the whole policy
            shard_from_rank_zero(self.policy, self.sharding_plan)  # rank 0's weights (LoRA's start at random)
            if self._reference is not None:
                shard_from_rank_zero(self._reference, self.sharding_plan)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)  # ExactResume: the mode's state now, RNG at the first step
        self.history.load_state_dict(checkpoint.get("run_history", {}))
        self._weights_changed()  # validate/test with a checkpoint, resume, eval before the first step

    def setup(self, stage: str) -> None:
        refusal = sharding_refusal(self.trainer.strategy)
        if refusal is not None:
            raise ValueError(refusal)
        if self.datamodule() is not None:
            self.mode.check_data(self.datamodule())
        self.mode.setup(self, stage)

    def teardown(self, stage: str) -> None:
        self.mode.teardown()

    def on_fit_start(self) -> None:
        reason = getattr(self.backend, "training_unsupported_reason", lambda: None)()
        if reason is not None and not self.hparams.dry_run:  # one line from `rlcode fit`, no traceback
            raise ServedModelError(f"rollout_backend openai cannot train here: {reason}. Use --model.dry_run true "
                                   "(rollouts and rewards only), or rollout_backend hf or vllm to train")
        if self._reference is not None and not is_sharded(self._reference):  # a sharded one is where its mesh is
            self._reference.to(self.device)

    def configure_optimizers(self):
        if self.policy is None:  # a served dry run holds no weights; Lightning still counts steps on an optimizer
            return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=self.hparams.learning_rate)
        reshard(self.policy)  # FSDP: the shards, not a gathered copy left by a pass without gradients
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return build_optimizer(self.hparams.optimizer, params, lr=self.hparams.learning_rate,
                               weight_decay=self.hparams.weight_decay, sharded=is_sharded(self.policy))

    # ---- one RL step ---------------------------------------------------------------------------
    def training_step(self, batch, batch_idx: int) -> None:
        hp, timings, ranks = self.hparams, {}, self.ranks()
        step, step_started = self.global_step, time.perf_counter()
        reset_peak_memory(self.device)
        start, self.abandoned_step_rng = step_start(self.mode, self.datamodule(), batch), None

        with timed(timings, "generation"), self.stop_token.collecting():  # rows to train; rewards start
            experience = self.mode.collect(self, batch)
            extra_metrics = self.mode.step_metrics(experience)
        refresh = getattr(self.backend, "take_refresh_seconds", lambda: None)()
        if refresh is not None:  # the int8 sampler's rebuild, inside generation: perf/sampler_refresh_s
            timings["sampler_refresh"] = refresh
        if self.stop_token.agreed(ranks, StopPoint.AFTER_COLLECT):  # give the step up (redone on resume)
            return self._abandon(start, experience)
        rollout = experience.rollout
        with timed(timings, "logps"):  # overlaps the sandbox running the rewards
            wants_reference = hp.beta != 0.0 and not hp.dry_run and rollout.completion_ids.size(0) > 0
            ref_logps = self._reference_logps(rollout) if wants_reference else None
        with timed(timings, "rewards_wait"):
            rewards = experience.rewards(self.device)  # [N], NaN = unscored

        loss_mask = mask_truncated(rollout.completion_mask, rollout.truncated) \
            if hp.mask_truncated_completions else rollout.completion_mask
        flat = self.mode.estimator.flat_rows(experience, rewards)  # [N] rows without a learning signal
        frac_flat = flat.float().mean() if flat.numel() else torch.zeros((), device=self.device)  # no rows: none flat
        totals = sum_over_ranks(ranks, rewards, loss_mask, frac_flat)  # the update's one collective
        advantages = self.mode.estimator.advantages(ranks, experience, rewards, totals)
        rows = self._rows_to_train(advantages)
        update = not hp.dry_run and totals.loss.tokens > 0 and ranks.any(len(rows) > 0)

        with timed(timings, "update"):
            try:
                loss_parts = self._update(rollout, loss_mask, advantages, ref_logps, rows, totals.loss) if update else {}
            except Stopped:  # a stop before the first optimizer step: the weights are as they were
                self.optimizers().zero_grad(set_to_none=True)
                return self._abandon(start, experience)
        if not update:
            count_step_without_update(self.optimizers())

        timings["step"] = time.perf_counter() - step_started
        self.last_step = experience.record(step=step, advantages=advantages, updated=update, loss=loss_parts,
                                           totals=totals, frac_zero_std=float(frac_flat), timings=timings,
                                           extra_metrics=extra_metrics)
        self.last_step.memory = peak_memory_gib(self.device)
        self.history.add_step(self.last_step, grad_norm=self.last_grad_norm, ranks=ranks)

    def _abandon(self, start, experience) -> None:
        abandon(start, experience, self.mode, self.datamodule(), self.device)
        self.abandoned_step_rng, self.history.last_step = start.rng, None

    def _rows_to_train(self, advantages):
        """Indices of the rows that go through the backward pass.

        Skipping rows with advantage exactly 0 (``skip_zero_advantage_rows``) is a pure speed-up:
        their surrogate and its gradient are 0, and the loss normalisers still count every row. With
        ``beta > 0`` their KL term has a gradient, so then every row is trained. The one visible
        difference: when no row of any rank has signal, the optimizer is not stepped at all.
        """
        if self.hparams.skip_zero_advantage_rows and self.hparams.beta == 0.0:
            return (advantages != 0).nonzero().flatten()
        return torch.arange(advantages.numel(), device=advantages.device)

    def _update(self, rollout: RolloutBatch, loss_mask, advantages, ref_logps, rows, totals) -> dict[str, float]:
        hp, optimizer, ranks = self.hparams, self.optimizers(), self.ranks()
        settings = UpdateSettings.from_learner(hp, getattr(self.backend, "importance_sampling_cap", None))
        hooks = TrainerHooks(backward=self.manual_backward, no_sync=lambda: no_gradient_sync(self.trainer.strategy),
                             step=lambda counted: update(optimizer, counted=counted),
                             world_size=self.trainer.world_size,
                             stop_agreed=lambda: self.stop_token.agreed(ranks, StopPoint.BEFORE_MICRO_BATCH),
                             count_range=ranks.count_range)
        # Said before the update, not after: the int8 sampler's copy (~110 MB) is then freed for the update's
        # memory peak; nothing generates until the update is done, so every copy is rebuilt from new weights.
        self._weights_changed()
        return update_policy(self.policy, hooks, settings, rollout, loss_mask, advantages, ref_logps, rows, totals)

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.hparams.max_grad_norm:
            self.last_grad_norm = clip_grad_norm(self.policy.parameters(), self.hparams.max_grad_norm)

    # ---- rlcode validate / test: the mode's own measure -------------------------------------------
    def validation_step(self, batch, batch_idx: int):
        return self.mode.validation_step(self, batch, batch_idx)

    def test_step(self, batch, batch_idx: int):
        return self.mode.test_step(self, batch, batch_idx)

    # ---- what a mode may ask (rlcode.training.mode.LearnerView) --------------------------------------
    def sampling_seed(self) -> int:
        return (self.hparams.generation_seed * 1_000_003 + self.global_step) * 1009 + self.global_rank

    def ranks(self) -> Ranks:
        trainer = self._trainer
        return Ranks(trainer.world_size, trainer.global_rank, self.device) if trainer is not None else Ranks()

    def run_tag(self) -> str:
        self.run_id = shared_run_id(self.trainer, self.run_id)  # tags the sandbox's executions of this run
        return self.run_id

    def pad_token_id(self) -> int:
        return getattr(self.tokenizer, "pad_token_id", None) or 0  # a served dry run has no tokenizer

    def datamodule(self):
        return getattr(self._trainer, "datamodule", None) if self._trainer is not None else None

    # ---- what the callbacks show ----------------------------------------------------------------------
    def run_description(self) -> RunDescription:
        """The banner's facts: the mode's (rewards, success, group size, opponent) and the learner's."""
        mode = self.mode.description()
        return RunDescription(mode=type(self.mode).__name__, model=self.model_description(), rewards=list(mode.rewards),
                              success_labels=success_labels(self), group_size=mode.group_size,
                              dry_run=bool(self.hparams.dry_run), opponent=mode.opponent)

    @property
    def rewards(self):
        """The mode's reward functions (a ``RewardMixture``), None for modes whose episodes score themselves."""
        return getattr(self.mode, "reward_mixture", None)

    @property
    def success_label(self) -> str | None:
        return self.mode.description().success_label

    @property
    def success_meaning(self) -> str | None:
        return self.mode.description().success_meaning

    # ---- checkpoints ---------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.save_resume_state(checkpoint)  # RNG states and the mode's state
        checkpoint["run_history"] = self.history.state_dict()
        if is_lora_model(self.policy):  # the frozen base is reloaded from its source: keep adapters only
            trainable = {n for n, p in self.named_parameters() if p.requires_grad}
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

