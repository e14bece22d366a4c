"""GRPO as a LightningModule: one training step reads as the algorithm.

    prompts -> G completions each -> rewards (started, running in the sandbox pool)
            -> meanwhile: reference log-probs (beta > 0)
            -> group advantages -> clipped policy loss, micro-batched -> optimizer step

Manual optimization, because one batch of prompts is a whole RL iteration: generation, scoring and
``num_iterations`` optimizer steps over the same rollouts. Everything a callback may want to log is
left in ``self.last_step`` (a StepRecord) and ``self.history`` (a RunHistory); the module logs nothing itself.

The model, tokenizer, rollout backend and reward functions are built in ``configure_model`` (so
``--print_config`` and tests of the config surface stay light) and kept on ``self``, outside the
hyperparameters. Dropout is off in the policy (as TRL's ``disable_dropout``): the log-probs of the
loss must be those of the policy that sampled, which generates in eval mode.

Distributed: DDP. Each rank trains on its own prompts (the DataModule shards them), gradients are
all-reduced once per optimizer update, and the ranks agree, in one all-reduce per step, on the loss
normalisers, the batch reward std and whether to update (``rlcode.training.all_ranks_totals``), so
a 2-rank step equals a 1-rank step on the combined batch. FSDP is not supported: the step runs
several forward/backward pairs and generation outside the wrapped module's forward.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any, Literal

import lightning as L
import torch

from rlcode.algorithms.advantages import RewardScaling, group_advantages, zero_std_group_mask
from rlcode.training.all_ranks_totals import sum_over_ranks
from rlcode.training.gradient_sync import clip_grad_norm
from rlcode.algorithms.losses import ImportanceSamplingLevel, LossType, mask_truncated
from rlcode.training.optimizer_steps import count_step_without_update
from rlcode.training.policy_update import update_policy
from rlcode.training.resume_state import ExactResume
from rlcode.rewards.mixture import RewardMixture
from rlcode.training.policy_rollouts import PolicyRollouts
from rlcode.training.run_context import RunContext
from rlcode.training.run_history import RunDescription, RunHistory
from rlcode.training.step_scalars import success_labels
from rlcode.logprobs.sequence_logps import batched_completion_logps
from rlcode.training.experience import CompletionGroups, repeat_each
from rlcode.training.step_record import StepRecord, timed
from rlcode.models.adapters import LoraSettings, Quantization
from rlcode.models.user_model import from_pretrained_model
from rlcode.rollout.backends import build_backend
from rlcode.rollout.openai.client import OpenAISettings
from rlcode.rollout.vllm.engine import VLLMSettings

if TYPE_CHECKING:
    from rlcode.data.datamodule import PromptBatch
    from rlcode.rollout.base import RolloutBatch

REWARD_COLUMNS = ("task_id", "test_list", "test_setup_code", "entry_point")


class GRPO(ExactResume, RunContext, PolicyRollouts, L.LightningModule):
    def __init__(
        self,
        model_name: str = "smollm2-135m-instruct",
        precision: str = "32-true",
        gradient_checkpointing: bool = False,
        lora: LoraSettings | None = None,
        quantization: Quantization | None = None,
        rewards: list[str] = ["execution"],  # noqa: B006 (jsonargparse needs the literal default)
        reward_weights: list[float] | None = None,
        reward_timeout: float = 10.0,
        sandbox_workers: int | None = None,
        sandbox_allow_visible_filesystem: bool = False,
        num_generations: int = 8,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: list[str] | None = None,
        rollout_backend: Literal["hf", "vllm", "openai"] = "hf",
        vllm: VLLMSettings | None = None,
        openai: OpenAISettings | None = None,
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
        share_prefix: bool = True,
        filter_zero_std_groups: bool = False,
        mask_truncated_completions: bool = False,
        max_grad_norm: float | None = 1.0,
        disable_dropout: bool = True,
        dry_run: bool = False,
    ) -> None:
        """Group Relative Policy Optimization of a causal LM on code rewards.

        Args:
            model_name: short name ("smollm2-135m-instruct", "tiny-random"), local folder or hub id.
            precision: weight precision as a Lightning string ("32-true", "bf16-true", ...).
            gradient_checkpointing: recompute activations in backward (less memory, ~13% slower).
            lora: train LoRA adapters instead of every weight; the adapter-free base is then the
                reference policy of the KL term.
            quantization: "4bit" (QLoRA: NF4, double quantization, compute dtype from ``precision``)
                or "8bit" base weights through transformers' BitsAndBytesConfig; needs ``lora``.
            rewards: reward function names from ``rlcode.rewards`` ("execution", "mbpp_tests",
                "mbpp_tests_fraction") or import paths "package.module:function" of TRL-style
                functions, summed with ``reward_weights``.
            reward_weights: one weight per reward (None: all 1.0).
            reward_timeout: seconds each completion may run in the sandbox.
            sandbox_workers: sandbox worker processes (None: the CPU cores shared among the
                node's ranks).
            sandbox_allow_visible_filesystem: score untrusted code even where no isolation layer
                hides your files from it (no bubblewrap, user namespaces or Landlock); see the README.
            num_generations: G, completions sampled per prompt (the group of GRPO's baseline).
            max_new_tokens: generation limit per completion.
            temperature: sampling temperature (also used to score tokens, as TRL does).
            top_p: nucleus sampling mass (1.0: off).
            top_k: sample from the k most likely tokens (0: off).
            stop: strings that end a completion early (None: those of the data's prompt format,
                the closing code fence for chat, ``[DONE]`` for the MBPP paper's plain format).
            rollout_backend: "hf" (transformers in this process), "vllm" (colocated engine on the
                same GPU, given the weights before a generate whenever they changed) or "openai" (a
                model behind an OpenAI-compatible server; with ``dry_run`` no local weights load).
            vllm: the vLLM engine's settings (memory, sleep mode, importance-sampling correction;
                see ``rlcode.rollout.vllm.engine.VLLMSettings``); None: the defaults.
            openai: the server's settings (``rlcode.rollout.openai.client.OpenAISettings``: base URL,
                model, api, concurrency, retries; the key only from the environment); None: defaults.
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
            share_prefix: in every log-prob pass, run each prompt prefix the micro-batch's rows
                share (a group's prompt, an episode's history) once and only the completions per
                row: same log-probs and gradients, fewer tokens (``rlcode.logprobs.shared_prefix``).
            filter_zero_std_groups: skip the backward pass of groups whose rewards are all equal: a
                pure speed-up, the update is the same (with beta > 0 nothing is skipped, since the KL
                term of such groups has a gradient).
            mask_truncated_completions: leave completions that hit max_new_tokens out of the loss.
            max_grad_norm: clip the gradient norm before each optimizer step (None: no clipping).
            disable_dropout: turn every dropout of the policy off (TRL's default): with dropout on,
                the scored log-probs are not those of the sampling policy and the ratio is noise.
            dry_run: generate and score, but never update the weights (checks a setup end to end;
                steps are still counted, so max_steps ends it).
        """
        super().__init__()
        if quantization is not None and lora is None:  # frozen quantized weights: only adapters can train
            raise ValueError(f"model.quantization={quantization!r} needs model.lora, e.g. --model.lora '{{r: 16}}'")
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
        self.history = RunHistory()  # every step's scalars, evals, how the run ended: what callbacks show
        self._reference = None  # a frozen copy, kept off the module tree (not saved, not optimized)
        self._sandbox = None
        self._eval_pool = None  # sandbox of rlcode validate / test
        self._eval_progress = None  # its progress lines (rlcode.eval.progress)
        self.run_id: str | None = None  # tags this run's sandbox executions (set by the CLI, else made up)
        self.init_resume_state()  # resume_parts: more state for an exact resume (resume_state.py)

    from_pretrained_model = classmethod(from_pretrained_model)  # GRPO.from_pretrained_model(model, tokenizer, ...)

    # ---- building (lazily, once) ------------------------------------------------------------
    def configure_model(self) -> None:
        if self.backend is not None:
            return
        from rlcode.models import compute_dtype, disable_dropout, is_lora_model, load_model, load_tokenizer

        hp = self.hparams
        if self.served_dry_run():
            self._configure_served_dry_run()
            return
        if self.policy is None:  # else handed in by from_pretrained_model, with its tokenizer
            self.tokenizer = load_tokenizer(hp.model_name)
            lora = LoraSettings(**hp.lora) if isinstance(hp.lora, dict) else hp.lora  # hparams may hold a dict
            self.policy = load_model(hp.model_name, precision=hp.precision, quantization=hp.quantization,
                                     gradient_checkpointing=hp.gradient_checkpointing, lora=lora)
        if hp.disable_dropout:
            disable_dropout(self.policy)
        self.policy.train()  # from_pretrained returns eval mode; generation switches back and forth itself
        if hp.beta != 0.0 and not is_lora_model(self.policy):
            # Copied before any checkpoint is restored: the reference stays the starting policy.
            # object.__setattr__: nn.Module would register it as a submodule, and every checkpoint
            # would carry a second copy of the weights. Only ever run forward, so it is kept in the
            # compute dtype (bf16 under bf16-mixed: half the memory of the fp32 master weights).
            reference = copy.deepcopy(self.policy).requires_grad_(False).eval()
            object.__setattr__(self, "_reference", reference.to(compute_dtype(self._training_precision())))
        if is_lora_model(self.policy):
            self.strict_loading = False  # checkpoints hold only the adapters (see on_save_checkpoint)
        self.backend = build_backend(hp.rollout_backend, self.policy, self.tokenizer, hp.model_name,
                                     vllm=hp.vllm, seed=hp.generation_seed, openai=hp.openai)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)  # ExactResume: RNG and reward state, back at the first step
        self.history.load_state_dict(checkpoint.get("run_history", {}))
        self._weights_changed()  # validate/test with a checkpoint, resume, eval before the first step

    def setup(self, stage: str) -> None:
        from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

        if isinstance(self.trainer.strategy, (FSDPStrategy, ModelParallelStrategy)):
            raise ValueError(f"{type(self.trainer.strategy).__name__} is not supported: a GRPO step generates and "
                             "runs several forward/backward passes outside the wrapped forward; use "
                             "trainer.strategy ddp (or auto) for several GPUs")
        if stage == "fit" and self.rewards is None:
            self.rewards = self._build_rewards()

    def _build_rewards(self) -> RewardMixture:
        from rlcode.rewards.factory import build_rewards
        from rlcode.run_dir.identity import shared_run_id

        self.run_id = shared_run_id(self.trainer, self.run_id)  # tags the sandbox's executions of this run
        functions, self._sandbox = build_rewards(self.hparams.rewards, timeout=self.hparams.reward_timeout,
                                                 pool_factory=self.sandbox_pool, run_id=self.run_id)
        return RewardMixture(functions, self.hparams.reward_weights)

    def teardown(self, stage: str) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox, self.rewards = None, None
        if self._eval_pool is not None:
            self._eval_pool.close()
            self._eval_pool = None

    def on_fit_start(self) -> None:
        reason = getattr(self.backend, "training_unsupported_reason", lambda: None)()
        if reason is not None and not self.hparams.dry_run:
            from rlcode.rollout.openai.client import ServedModelError  # one line from `rlcode fit`, no traceback

            raise ServedModelError(f"rollout_backend openai cannot train here: {reason}. Use --model.dry_run true "
                             "(rollouts and rewards only), or rollout_backend hf or vllm to train")
        if self._reference is not None:
            self._reference.to(self.device)

    def configure_optimizers(self):
        if self.policy is None:  # a served dry run holds no weights; Lightning still counts steps on an optimizer
            return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=self.hparams.learning_rate)
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.hparams.learning_rate, weight_decay=self.hparams.weight_decay)

    # ---- one RL step ---------------------------------------------------------------------------
    def training_step(self, batch: PromptBatch, batch_idx: int) -> None:
        hp, timings = self.hparams, {}
        step, step_started = self.global_step, time.perf_counter()

        with timed(timings, "generation"):  # rows to train on; their rewards start computing
            experience = self.collect(batch)
        with timed(timings, "logps"):  # overlaps the sandbox running the rewards
            ref_logps = self._reference_logps(experience.rollout) if hp.beta != 0.0 and not hp.dry_run else None
        with timed(timings, "rewards_wait"):
            rewards = experience.rewards(self.device)  # [N], NaN = unscored

        rollout = experience.rollout
        loss_mask = mask_truncated(rollout.completion_mask, rollout.truncated) \
            if hp.mask_truncated_completions else rollout.completion_mask
        flat = self.flat_rows(experience, rewards)  # [N] rows without a learning signal
        totals = sum_over_ranks(self.trainer, rewards, loss_mask, flat.float().mean())  # the step's one collective
        advantages = self.advantages(experience, rewards, totals)
        rows = self._rows_to_train(advantages)
        update = not hp.dry_run and totals.loss.tokens > 0 and self._any_rank(len(rows) > 0)

        with timed(timings, "update"):
            loss_parts = update_policy(self, rollout, loss_mask, advantages, ref_logps, rows, totals.loss) if update else {}
        if not update:
            count_step_without_update(self.optimizers())

        timings["step"] = time.perf_counter() - step_started
        self.last_step = experience.record(step=step, advantages=advantages, updated=update, loss=loss_parts,
                                           totals=totals, frac_zero_std=float(flat.float().mean()), timings=timings)
        self.history.add_step(self.last_step, grad_norm=getattr(self, "last_grad_norm", None))

    # ---- the stages a training mode defines ---------------------------------------------------
    def collect(self, batch: PromptBatch) -> CompletionGroups:
        """G completions per MBPP prompt (prompt-major), their rewards started in the sandbox."""
        group = self.hparams.num_generations
        prompts = [self.render(p) for p in batch["prompt"]]
        rollout = self.generate(prompts, group, temperature=self.hparams.temperature, seed=self._sampling_seed())
        columns = {name: repeat_each(batch[name], group) for name in REWARD_COLUMNS if name in batch}
        columns["step"] = self.global_step  # tags the sandbox executions of this step
        job = self.rewards.start(repeat_each(prompts, group), rollout.completion_texts, **columns)
        return CompletionGroups(rollout, prompts, list(batch["task_id"]), group, job)

    def flat_rows(self, experience, rewards):
        """[N] bool: rows whose group's rewards are all equal (no signal; logged, and skippable)."""
        return zero_std_group_mask(rewards, self.hparams.num_generations)

    def advantages(self, experience, rewards, totals):
        """[N] group-relative advantages (``scale_rewards="batch"``: the std of every rank's rewards)."""
        advantages, _ = group_advantages(rewards, self.hparams.num_generations, self.hparams.scale_rewards,
                                         batch_std=totals.reward_std)
        return advantages

    def _any_rank(self, decision: bool) -> bool:
        # Under DDP a rank that skipped its backward while another synced gradients would hang the run.
        if self.trainer.world_size == 1:
            return decision
        return self.trainer.strategy.reduce_boolean_decision(decision, all=False)

    def _rows_to_train(self, advantages):
        """Indices of the rows that go through the backward pass.

        Skipping rows with advantage exactly 0 (``filter_zero_std_groups``: a group whose rewards
        are all equal gets advantage 0) is a pure speed-up: their surrogate and its gradient are 0,
        and the loss normalisers still count every row. With ``beta > 0`` their KL term has a
        gradient, so then every row is trained. The one visible difference: when no row of any rank
        has signal, the optimizer is not stepped at all (no weight decay, no momentum).
        """
        if self._skips_zero_advantage() and self.hparams.beta == 0.0:
            return (advantages != 0).nonzero().flatten()
        return torch.arange(advantages.numel(), device=advantages.device)

    def _skips_zero_advantage(self) -> bool:
        return self.hparams.filter_zero_std_groups

    # ---- rlcode validate / test: greedy pass rate on MBPP ----------------------------------------
    # Each returns its batch's EvalReport: the eval callback writes the per-problem results.
    def validation_step(self, batch: PromptBatch, batch_idx: int):
        return self._log_greedy_pass_rate(batch, batch_idx, f"{self._eval_benchmark()}_eval")

    def test_step(self, batch: PromptBatch, batch_idx: int):
        return self._log_greedy_pass_rate(batch, batch_idx, f"{self._eval_benchmark()}_test")

    def _eval_benchmark(self) -> str:
        """"mbpp" or "humaneval" (``eval.benchmark``, passed on through the DataModule)."""
        return getattr(getattr(self._trainer, "datamodule", None), "eval_benchmark", "mbpp")

    def _log_greedy_pass_rate(self, batch: PromptBatch, batch_idx: int, prefix: str):
        from rlcode.eval.policy_scoring import BENCHMARK_NAMES, score_batch
        from rlcode.eval.progress import EvalProgress, problems_in_eval_loop

        if self._eval_pool is None:
            self._eval_pool = self.sandbox_pool(self.hparams.reward_timeout)
        if batch_idx == 0:  # a new validate / test loop: count its problems from zero
            testing = prefix.endswith("_test")
            name = BENCHMARK_NAMES[self._eval_benchmark()]
            self._eval_progress = EvalProgress(f"{name} test" if testing else f"{name} validate",
                                               problems_in_eval_loop(self.trainer, testing))
        report = score_batch(self, batch, self._eval_pool, split=prefix, progress=self._eval_progress)
        count = len(report.problems)
        self.log(f"{prefix}/pass_rate", report.pass_rate, batch_size=count)  # weighted mean over batches
        self.log(f"{prefix}/problems_passed", float(report.problems_passed), reduce_fx="sum", batch_size=count)
        return report

    def run_description(self) -> RunDescription:
        """What the banner, the step lines and the summary say the run is."""
        hp = self.hparams
        rewards = getattr(self, "reward_description", None) or list(hp.rewards)  # episodes that score themselves
        return RunDescription(mode=type(self).__name__, model=self.model_description(),
                              rewards=[rewards] if isinstance(rewards, str) else rewards,
                              success_labels=success_labels(self), group_size=hp.num_generations,
                              dry_run=bool(hp.dry_run), opponent=hp.get("opponent"))

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.hparams.max_grad_norm:
            self.last_grad_norm = clip_grad_norm(self.policy.parameters(), self.hparams.max_grad_norm)

    # ---- log-probs under the policy and the reference ------------------------------------------
    def _logps(self, model, rollout: RolloutBatch):
        return batched_completion_logps(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                        rollout.completion_mask, self.hparams.temperature,
                                        self.hparams.micro_batch_size, share_prefix=self.hparams.share_prefix)

    def _reference_logps(self, rollout: RolloutBatch):
        from rlcode.models import reference_mode

        if self._reference is not None:
            return self._logps(self._reference, rollout)
        with reference_mode(self.policy):  # LoRA: the base without adapters is the reference
            return self._logps(self.policy, rollout)

    def _sampling_seed(self) -> int:
        return (self.hparams.generation_seed * 1_000_003 + self.global_step) * 1009 + self.global_rank

    # ---- checkpoints ---------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        from rlcode.models import is_lora_model

        self.save_resume_state(checkpoint)  # RNG states, reward and estimator state
        checkpoint["run_history"] = self.history.state_dict()
        if is_lora_model(self.policy):  # the frozen base is reloaded from its source: keep adapters only
            trainable = {n for n, p in self.named_parameters() if p.requires_grad}
            checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in trainable}

