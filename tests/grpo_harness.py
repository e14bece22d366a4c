"""A GRPO step on fixed rollouts, for tests that compare gradients between set-ups.

``FixedRollouts`` replaces the module's generation: virtual prompt k (k counts over ranks, so a
2-rank run and a 1-rank run on twice the prompts see the same rows) always gets the same G
completions, of varied lengths; ``length_reward`` scores them by length, so every group has signal
unless a test wants otherwise. ``GradientRecorder`` copies the gradients at each optimizer update,
after DDP's all-reduce and before clipping or the optimizer touch them.
"""

from __future__ import annotations

import lightning as L
import torch

from exact_float64 import assert_float64_equal, in_float64
from rlcode.modes import GRPO
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.training.learner import Learner

PROMPT_LENGTH = 5


def fixed_rollout(virtual_prompts: list[int], group: int, vocab: int = 200, pad: int = 0):
    """G completions per virtual prompt; lengths vary from 1 to 6 tokens, some rows flagged truncated."""
    prompt_ids, completion_ids, ended, texts = [], [], [], []
    for k in virtual_prompts:
        for g in range(group):
            prompt_ids.append([3 + (k * 11 + i * 7) % (vocab - 3) for i in range(PROMPT_LENGTH)])
            length = 1 + (k * 5 + g * 3) % 6
            completion_ids.append([3 + (k * 13 + g * 17 + i * 5) % (vocab - 3) for i in range(length)])
            ended.append((k + g) % 3 != 0)
            texts.append("x" * length)
    return batch_from_token_lists(prompt_ids, completion_ids, ended, texts, pad_token_id=pad)


# Rewards are multiples of 1/8, exact in float32: their sums, means and variances come out the same
# in any order, so the (float32) advantages are bit-identical however ranks or micro-batches split them.
def length_reward(prompts, completions, **columns) -> list[float]:
    return [len(text) / 8.0 for text in completions]


def constant_reward(prompts, completions, **columns) -> list[float]:
    return [1.0 for _ in completions]


def first_group_only_reward(prompts, completions, **columns) -> list[float]:
    """Signal in the first group of 4 only; the other groups are flat (and filtered when asked)."""
    return [len(text) / 8.0 if i < 4 else 0.0 for i, text in enumerate(completions)]


def use_fixed_rollouts(module) -> None:
    """Make ``module.generate`` return ``fixed_rollout`` rows (the same whatever the rank layout)."""

    def generate(prompts, num_generations, **kwargs):
        first = module.global_rank * len(prompts)
        rollout = fixed_rollout(list(range(first, first + len(prompts))), num_generations)
        return type(rollout)(**{**rollout.__dict__, **{
            name: getattr(rollout, name).to(module.device)
            for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")}})

    module.generate = generate


class GradientRecorder(L.Callback):
    """Every update's gradients, by parameter name (None where a parameter got no gradient)."""

    def __init__(self) -> None:
        self.updates: list[dict[str, torch.Tensor | None]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.updates.append({name: None if p.grad is None else p.grad.detach().clone()
                             for name, p in pl_module.policy.named_parameters() if p.requires_grad})


MODE_SETTINGS = ("rewards", "reward_weights", "reward_timeout", "num_generations", "scale_rewards", "sandbox")


def build_module(configure: bool = True, float64: bool = False, **overrides):
    """A Learner with the GRPO mode on the tiny random model with fixed rollouts (``configure``: build
    the model now). ``overrides`` may hold the learner's settings and GRPO's (``MODE_SETTINGS``).

    ``float64``: weights and arithmetic in float64 throughout (``exact_float64``), for gradient
    comparisons that hold to rounding; ``fit_steps`` then trains in Lightning's "64-true".
    """
    settings = {"model_name": "tiny-random", "max_new_tokens": 6, "micro_batch_size": 8, "max_grad_norm": None,
                "learning_rate": 1e-3, **{k: v for k, v in overrides.items() if k not in MODE_SETTINGS}}
    mode = GRPO(**{"rewards": ["grpo_harness:length_reward"], "num_generations": 4,
                   **{k: v for k, v in overrides.items() if k in MODE_SETTINGS}})
    if float64:
        settings["precision"] = "64-true"
    module = Learner(mode=mode, **settings)
    if float64:
        configure_model = module.configure_model

        def configure_in_float64() -> None:
            configure_model()
            in_float64(module.policy)
            if getattr(module, "_reference", None) is not None:
                in_float64(module._reference)

        module.configure_model = configure_in_float64
    if configure:
        module.configure_model()
    use_fixed_rollouts(module)
    return module


def fit_steps(module, *, steps: int = 1, prompts_per_step: int = 2, callbacks=(), ckpt_path=None, **trainer_kwargs):
    """Fit ``steps`` steps on MBPP prompts (text unused: the rollouts are fixed); returns the trainer."""
    from rlcode.data.datamodule import MBPPDataModule

    data = MBPPDataModule(num_train_tasks=8, prompts_per_step=prompts_per_step)
    settings = dict(accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                    limit_val_batches=0)
    if str(module.hparams.precision).startswith("64"):
        settings["precision"] = "64-true"
    trainer = L.Trainer(**{**settings, **trainer_kwargs}, callbacks=list(callbacks))
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer


def assert_same_gradients(a: dict, b: dict) -> None:
    """Every parameter's float64 gradient equal up to summation order (``exact_float64``: 1e-12 of
    its scale; a normaliser that is off by any factor fails by orders of magnitude)."""
    assert a.keys() == b.keys() and a
    moved = 0
    for name in a:
        if a[name] is None or b[name] is None:
            assert a[name] is None and b[name] is None or _is_zero(a[name]) and _is_zero(b[name]), name
            continue
        assert_float64_equal(a[name], b[name], name)
        moved += bool(a[name].abs().max() > 0)
    assert moved, "no parameter got a gradient: the comparison would mean nothing"


def _is_zero(tensor) -> bool:
    return tensor is None or not bool(tensor.abs().max() > 0)


def learner(mode_class=GRPO, **settings):
    """``Learner(mode=mode_class(...), ...)`` from one set of keyword settings, split between the mode
    (the arguments of its ``__init__``) and the learner (the rest)."""
    import inspect

    own = set(inspect.signature(mode_class.__init__).parameters) - {"self"}
    mode = mode_class(**{key: value for key, value in settings.items() if key in own})
    return Learner(mode=mode, **{key: value for key, value in settings.items() if key not in own})
