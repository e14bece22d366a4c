"""GRPO as a LightningModule: one training step reads as the algorithm.

    prompts -> G completions each -> rewards (started, running in the sandbox pool)
            -> meanwhile: old log-probs (num_iterations > 1) and reference log-probs (beta > 0)
            -> group advantages -> clipped policy loss, micro-batched -> optimizer step

Manual optimization, because one batch of prompts is a whole RL iteration: generation, scoring and
``num_iterations`` optimizer steps over the same rollouts. Everything a callback may want to log is
left in ``self.last_step`` (a StepRecord); the module logs nothing itself.

The model, tokenizer, rollout backend and reward functions are built in ``configure_model`` (so
``--print_config`` and tests of the config surface stay light, and FSDP can wrap the model) and kept
on ``self``, outside the hyperparameters.

Distributed (DDP): each rank trains on its own prompts (the DataModule shards them), gradients are
all-reduced once per optimizer step, and the ranks agree, in one all-reduce per step, on whether to
update and on dapo's token count (see ``rlcode.algorithms.all_ranks_totals``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch

from rlcode.algorithms.advantages import RewardScaling, group_advantages, zero_std_group_mask
from rlcode.algorithms.all_ranks_totals import sum_over_ranks
from rlcode.algorithms.gradient_sync import clip_grad_norm, no_gradient_sync
from rlcode.algorithms.importance_correction import importance_corrected_advantages
from rlcode.algorithms.losses import ImportanceSamplingLevel, LossType, mask_truncated, policy_loss
from rlcode.algorithms.reward_mixture import RewardMixture
from rlcode.algorithms.sequence_logps import batched_completion_logps, completion_logps
from rlcode.algorithms.step_record import StepRecord, timed
from rlcode.models.adapters import LoraSettings
from rlcode.rollout.backends import build_backend
from rlcode.rollout.vllm_engine import VLLMSettings

if TYPE_CHECKING:
    from rlcode.data.datamodule import PromptBatch
    from rlcode.rollout.base import RolloutBatch

REWARD_COLUMNS = ("task_id", "test_list", "test_setup_code", "entry_point")
_ROLLOUT_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")


class GRPO(L.LightningModule):
    def __init__(
        self,
        model_name: str = "smollm2-135m-instruct",
        precision: str = "32-true",
        gradient_checkpointing: bool = False,
        lora: LoraSettings | None = None,
        rewards: list[str] = ["execution"],  # noqa: B006 (jsonargparse needs the literal default)
        reward_weights: list[float] | None = None,
        reward_timeout: float = 10.0,
        sandbox_workers: int | None = None,
        num_generations: int = 8,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: list[str] | None = None,
        rollout_backend: Literal["hf", "vllm"] = "hf",
        vllm: VLLMSettings | None = None,
        generation_seed: int = 0,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        loss_type: LossType = "dapo",
        beta: float = 0.0,
        epsilon_low: float = 0.2,
        epsilon_high: float = 0.2,
        importance_sampling_level: ImportanceSamplingLevel = "token",
        scale_rewards: RewardScaling = "group",
        num_iterations: int = 1,
        micro_batch_size: int = 8,
        filter_zero_std_groups: bool = False,
        mask_truncated_completions: bool = False,
        max_grad_norm: float | None = 1.0,
        dry_run: bool = False,
    ) -> None:
        """Group Relative Policy Optimization of a causal LM on code rewards.

        Args:
            model_name: short name ("smollm2-135m-instruct", "tiny-random"), local folder or hub id.
            precision: weight precision as a Lightning string ("32-true", "bf16-true", ...).
            gradient_checkpointing: recompute activations in backward (less memory, ~13% slower).
            lora: train LoRA adapters instead of every weight; the adapter-free base is then the
                reference policy of the KL term.
            rewards: reward function names from ``rlcode.rewards`` ("execution", "mbpp_tests",
                "mbpp_tests_fraction") or import paths "package.module:function" of TRL-style
                functions, summed with ``reward_weights``.
            reward_weights: one weight per reward (None: all 1.0).
            reward_timeout: seconds each completion may run in the sandbox.
            sandbox_workers: sandbox worker processes (None: one per CPU core).
            num_generations: G, completions sampled per prompt (the group of GRPO's baseline).
            max_new_tokens: generation limit per completion.
            temperature: sampling temperature (also used to score tokens, as TRL does).
            top_p: nucleus sampling mass (1.0: off).
            top_k: sample from the k most likely tokens (0: off).
            stop: strings that end a completion early (e.g. the closing code fence).
            rollout_backend: "hf" (transformers in this process) or "vllm" (colocated engine on the
                same GPU, given the weights before a generate whenever they changed).
            vllm: the vLLM engine's settings (memory, sleep mode, importance-sampling correction;
                see ``rlcode.rollout.vllm_engine.VLLMSettings``); None: the defaults.
            generation_seed: base seed of sampling; each step draws from (seed, step, rank), so a
                resumed run samples what the uninterrupted one would have.
            learning_rate: AdamW learning rate.
            weight_decay: AdamW weight decay.
            loss_type: "dapo" (token-level, TRL's default), "grpo", "bnpo" or "dr_grpo".
            beta: weight of the KL penalty to the reference policy (0: no reference model).
            epsilon_low: lower clip range of the importance ratio.
            epsilon_high: upper clip range (DAPO's clip-higher uses 0.28).
            importance_sampling_level: "token" (GRPO) or "sequence" (GSPO).
            scale_rewards: divide advantages by the "group" std, the "batch" std, or "none".
            num_iterations: optimizer steps per batch of rollouts (PPO-style reuse; >1 stores
                old log-probs so the clip acts).
            micro_batch_size: completions per forward/backward pass; gradients accumulate over
                the whole group batch before each optimizer step.
            filter_zero_std_groups: skip groups whose rewards are all equal (no signal) in the loss.
            mask_truncated_completions: leave completions that hit max_new_tokens out of the loss.
            max_grad_norm: clip the gradient norm before each optimizer step (None: no clipping).
            dry_run: generate and score, but never update the weights (checks a setup end to end;
                steps are still counted, so max_steps ends it).
        """
        super().__init__()
        if num_generations < 2 and scale_rewards == "group":
            raise ValueError("num_generations=1 gives every group a zero std (no learning signal): "
                             "use num_generations >= 2")
        if num_iterations < 1 or micro_batch_size < 1:
            raise ValueError("num_iterations and micro_batch_size must be >= 1")
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.policy = None
        self.tokenizer = None
        self.backend = None
        self.rewards: RewardMixture | None = None
        self.last_step: StepRecord | None = None
        self._reference = None  # a frozen copy, kept off the module tree (not saved, not optimized)
        self._sandbox = None
        self._judge = None  # MBPP all-tests reward, for validate/test

    # ---- building (lazily, once) ------------------------------------------------------------
    def configure_model(self) -> None:
        if self.policy is not None:
            return
        from rlcode.models import is_lora_model, load_model, load_tokenizer

        hp = self.hparams
        self.tokenizer = load_tokenizer(hp.model_name)
        lora = LoraSettings(**hp.lora) if isinstance(hp.lora, dict) else hp.lora  # hparams may hold a plain dict
        self.policy = load_model(hp.model_name, precision=hp.precision,
                                 gradient_checkpointing=hp.gradient_checkpointing, lora=lora)
        self.policy.train()  # from_pretrained returns eval mode; generation switches back and forth itself
        if hp.beta != 0.0 and not is_lora_model(self.policy):
            # Copied before any checkpoint is restored: the reference stays the starting policy.
            # object.__setattr__: nn.Module would register it as a submodule, and every checkpoint
            # would carry a second copy of the weights.
            object.__setattr__(self, "_reference", copy.deepcopy(self.policy).requires_grad_(False).eval())
        if is_lora_model(self.policy):
            self.strict_loading = False  # checkpoints hold only the adapters (see on_save_checkpoint)
        self.backend = build_backend(hp.rollout_backend, self.policy, self.tokenizer, hp.model_name,
                                     vllm=hp.vllm, seed=hp.generation_seed)

    def _weights_changed(self) -> None:
        # vLLM holds its own copy of the weights: it takes the policy's again before its next generate.
        if callable(getattr(self.backend, "weights_changed", None)):
            self.backend.weights_changed()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._weights_changed()  # validate/test with a checkpoint, resume, eval before the first step

    def setup(self, stage: str) -> None:
        if stage == "fit" and self.rewards is None:
            self.rewards = self._build_rewards()

    def _build_rewards(self) -> RewardMixture:
        from rlcode.algorithms.reward_factory import build_rewards

        functions, self._sandbox = build_rewards(self.hparams.rewards, timeout=self.hparams.reward_timeout,
                                                 workers=self.hparams.sandbox_workers)
        return RewardMixture(functions, self.hparams.reward_weights)

    def teardown(self, stage: str) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox, self.rewards = None, None
        if self._judge is not None:
            self._judge.close()
            self._judge = None

    def on_fit_start(self) -> None:
        if self._reference is not None:
            self._reference.to(self.device)

    def configure_optimizers(self):
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.hparams.learning_rate, weight_decay=self.hparams.weight_decay)

    # ---- one GRPO iteration -----------------------------------------------------------------
    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        hp, timings = self.hparams, {}
        step, step_started = self.global_step, time.perf_counter()
        group = hp.num_generations
        prompts = [self.render(p) for p in batch["prompt"]]

        with timed(timings, "generation"):
            # N = prompts x G rows, prompt-major, tensors on the policy's device
            rollout = self.generate(prompts, group, temperature=hp.temperature, seed=self._sampling_seed())

        columns = {name: _repeat_each(batch[name], group) for name in REWARD_COLUMNS if name in batch}
        columns["step"] = self.global_step  # tags the sandbox executions of this step
        reward_job = self.rewards.start(_repeat_each(prompts, group), rollout.completion_texts, **columns)

        with timed(timings, "logps"):  # overlaps the sandbox running the rewards
            # vLLM's sampling log-probs come with its importance-sampling correction on, which (as in
            # TRL) needs the policy's own log-probs of the samples
            sampler_mismatch = rollout.sampling_logps is not None
            old_logps = self._logps(self.policy, rollout) if hp.num_iterations > 1 or sampler_mismatch else None
            ref_logps = self._reference_logps(rollout) if hp.beta != 0.0 else None

        with timed(timings, "rewards_wait"):
            outcome = reward_job.result()
        rewards = torch.tensor(outcome.total, dtype=torch.float32, device=self.device)
        advantages, stats = group_advantages(rewards, group, hp.scale_rewards)

        loss_mask = rollout.completion_mask
        if hp.mask_truncated_completions:
            loss_mask = mask_truncated(loss_mask, rollout.truncated)
        keep = torch.ones_like(rewards, dtype=torch.bool)
        if hp.filter_zero_std_groups:
            keep = ~zero_std_group_mask(rewards, group)
        batch_totals = sum_over_ranks(self.trainer, rewards, loss_mask[keep].sum(), stats.frac_reward_zero_std)
        # Decided on the tokens of every rank: under DDP a rank that skipped its backward while
        # another synced gradients would hang the run.
        update = not hp.dry_run and batch_totals.tokens > 0

        loss_advantages, correction_metrics = advantages, {}
        if sampler_mismatch:  # [N] -> [N, T] advantages weighted by TRL's truncated importance ratio
            loss_advantages, correction_metrics = importance_corrected_advantages(
                advantages, old_logps, rollout.sampling_logps, loss_mask, self.backend.importance_sampling_cap)

        with timed(timings, "update"):
            loss_parts = (self._update(rollout, loss_mask, loss_advantages, old_logps, ref_logps, keep,
                                       batch_totals.tokens) if update else {})
            loss_parts.update(correction_metrics)
        if not update:
            self._step_without_update()

        timings["step"] = time.perf_counter() - step_started
        timings["rewards"] = outcome.seconds
        self.last_step = StepRecord(
            step=step, group_size=group,
            task_ids=list(batch["task_id"]), prompts=prompts, completions=list(rollout.completion_texts),
            rewards=outcome.total, rewards_by_function=outcome.by_function, details=outcome.details,
            advantages=advantages.tolist(), completion_lengths=rollout.completion_mask.sum(1).long().tolist(),
            truncated=rollout.truncated.tolist(), frac_reward_zero_std=float(stats.frac_reward_zero_std),
            updated=update, loss=loss_parts, reward_metrics={**outcome.metrics, **batch_totals.metrics()},
            timings=timings,
        )

    # ---- rlcode validate / test: greedy pass rate on MBPP ----------------------------------------
    def validation_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self._log_greedy_pass_rate(batch, "mbpp_eval")

    def test_step(self, batch: PromptBatch, batch_idx: int) -> None:
        self._log_greedy_pass_rate(batch, "mbpp_test")

    def _log_greedy_pass_rate(self, batch: PromptBatch, prefix: str) -> None:
        if self._judge is None:
            from rlcode.rewards import MBPPTestsPassed

            self._judge = MBPPTestsPassed(timeout=self.hparams.reward_timeout, workers=self.hparams.sandbox_workers)
        prompts = [self.render(p) for p in batch["prompt"]]
        rollout = self.generate(prompts, 1, temperature=0.0, seed=0)
        columns = {name: batch[name] for name in REWARD_COLUMNS if name in batch}
        passed = self._judge(prompts, rollout.completion_texts, **columns)
        count = len(passed)
        self.log(f"{prefix}/pass_rate", sum(passed) / count, batch_size=count)  # weighted mean over batches
        self.log(f"{prefix}/problems_passed", float(sum(passed)), reduce_fx="sum", batch_size=count)

    def _update(self, rollout: RolloutBatch, loss_mask, advantages, old_logps, ref_logps, keep,
                all_ranks_tokens: float) -> dict[str, float]:
        """``num_iterations`` optimizer steps over the kept completions, micro-batched.

        Under DDP, gradients are all-reduced once per optimizer step: every micro-batch but the last
        runs its backward in the strategy's ``block_backward_sync`` (DDP's ``no_sync``), which is
        also what lets ranks run different numbers of micro-batches. A rank whose groups were all
        filtered out still joins the one sync with a zero-weighted backward of one completion.
        """
        hp = self.hparams
        optimizer = self.optimizers()
        rows = keep.nonzero().flatten()
        contributes = len(rows) > 0
        micro_batches = list(rows.split(hp.micro_batch_size)) if contributes else [torch.arange(1, device=keep.device)]
        # dapo's normaliser: every token of the step, on every rank, weighs the same. TRL divides by
        # the token count of all processes over num_processes, since DDP then averages the gradients
        # over the world size: sum over ranks of (local token-loss sum) / all tokens, as on one device.
        tokens_in_batch = torch.tensor(all_ranks_tokens / self.trainer.world_size, device=self.device)
        totals: dict[str, float] = {}
        for _ in range(hp.num_iterations):
            for position, index in enumerate(micro_batches):
                logps = completion_logps(self.policy, rollout.prompt_ids[index], rollout.prompt_mask[index],
                                         rollout.completion_ids[index], rollout.completion_mask[index],
                                         hp.temperature)
                loss, parts = policy_loss(
                    logps, advantages[index], loss_mask[index],
                    None if old_logps is None else old_logps[index],
                    None if ref_logps is None else ref_logps[index],
                    loss_type=hp.loss_type, epsilon_low=hp.epsilon_low, epsilon_high=hp.epsilon_high,
                    beta=hp.beta, importance_sampling_level=hp.importance_sampling_level,
                    max_completion_length=hp.max_new_tokens, num_items_in_batch=tokens_in_batch,
                    accumulation_steps=len(micro_batches))
                if not contributes:
                    loss = loss * 0.0  # zero gradients, but the backward (and its all-reduce) still runs
                last = position == len(micro_batches) - 1
                with nullcontext() if last else no_gradient_sync(self.trainer.strategy):
                    self.manual_backward(loss)
                if contributes:
                    _accumulate(totals, {"loss": loss.detach(), **parts.as_dict()},
                                len(micro_batches) * hp.num_iterations)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        self._weights_changed()
        if not contributes:
            return totals
        # micro-batch losses are shares of the step's loss (they sum to it); the other parts are means
        totals["loss"] *= len(micro_batches)
        if hp.loss_type == "dapo":
            totals["policy_loss"] *= len(micro_batches)
        return totals

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.hparams.max_grad_norm:
            self.last_grad_norm = clip_grad_norm(self.trainer.strategy, self.policy.parameters(),
                                                 self.hparams.max_grad_norm)

    # ---- building blocks the callbacks reuse --------------------------------------------------
    def render(self, prompt) -> str:
        """Chat messages through the tokenizer's chat template; plain text as it is."""
        from rlcode.rollout import render_prompt

        return render_prompt(self.tokenizer, prompt, chat=isinstance(prompt, list))

    def generate(self, prompts: list[str], num_generations: int, *, temperature: float,
                 max_new_tokens: int | None = None, seed: int | None = None):
        """G completions per rendered prompt (prompt-major); the backend switches to eval mode."""
        from rlcode.rollout import SamplingParams

        hp = self.hparams
        params = SamplingParams(temperature=temperature, top_p=hp.top_p, top_k=hp.top_k,
                                max_new_tokens=max_new_tokens or hp.max_new_tokens,
                                stop=list(hp.stop or []), seed=seed)
        rollout = self.backend.generate(prompts, num_generations, params)
        # The HF backend decodes under inference_mode, and autograd refuses such tensors as inputs;
        # vLLM returns CPU tensors. The loss gets ordinary copies on the policy's device.
        return dataclasses.replace(rollout, **{name: getattr(rollout, name).to(self.device, copy=True)
                                               for name in _ROLLOUT_TENSORS})

    def _logps(self, model, rollout: RolloutBatch):
        return batched_completion_logps(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                        rollout.completion_mask, self.hparams.temperature,
                                        self.hparams.micro_batch_size)

    def _reference_logps(self, rollout: RolloutBatch):
        from rlcode.models import reference_mode

        if self._reference is not None:
            return self._logps(self._reference, rollout)
        with reference_mode(self.policy):  # LoRA: the base without adapters is the reference
            return self._logps(self.policy, rollout)

    def _sampling_seed(self) -> int:
        return (self.hparams.generation_seed * 1_000_003 + self.global_step) * 1009 + self.global_rank

    def _step_without_update(self) -> None:
        """Count a step that changes nothing (dry run, or every group filtered out).

        Lightning counts optimizer steps: max_steps, checkpoints and evals follow that count. With
        every gradient None, AdamW skips every parameter, so weights and moments stay untouched.
        """
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()

    # ---- checkpoints ---------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from rlcode.models import is_lora_model

        if is_lora_model(self.policy):  # the frozen base is reloaded from its source: keep adapters only
            trainable = {n for n, p in self.named_parameters() if p.requires_grad}
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}


def _repeat_each(values: list, times: int) -> list:
    """[a, b] -> [a, a, b, b] for times=2: one entry per completion, prompt-major."""
    return [value for value in values for _ in range(times)]


def _accumulate(totals: dict[str, float], parts: dict[str, Any], count: int) -> None:
    for key, value in parts.items():
        totals[key] = totals.get(key, 0.0) + float(value) / count
