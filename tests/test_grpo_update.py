"""The GRPO update at trainer level: what one step computes must not depend on how it is computed.

Each test runs real Lightning steps of ``GRPO`` on fixed rollouts (``grpo_harness``) and compares the
gradients of the update, recorded after any all-reduce and before the optimizer.
"""

from __future__ import annotations

import pytest
import torch

from exact_float64 import FLOAT64_TOLERANCE
from grpo_harness import GradientRecorder, assert_same_gradients, build_module, fit_steps

LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo"]


def _gradients(steps: int = 1, prompts_per_step: int = 2, trainer_kwargs=None, **settings):
    recorder = GradientRecorder()
    module = build_module(float64=True, **settings)
    trainer = fit_steps(module, steps=steps, prompts_per_step=prompts_per_step, callbacks=[recorder],
                        **(trainer_kwargs or {}))
    return recorder.updates, trainer, module


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batch_size_does_not_change_the_gradient(loss_type):
    """Micro-batches of 1, 3 (a partial last one: 8 rows = 3 + 3 + 2) and all rows
    give the same gradient for every loss type. Before, grpo/bnpo/dr_grpo normalised each micro-batch
    by its own size and divided by the number of micro-batches."""
    reference, _, _ = _gradients(loss_type=loss_type, micro_batch_size=8)
    for size in (1, 3):
        updates, _, _ = _gradients(loss_type=loss_type, micro_batch_size=size)
        assert_same_gradients(updates[0], reference[0])


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_filtering_flat_groups_is_a_pure_speed_up(loss_type):
    """Skipping zero-std groups gives the gradient of not skipping them. Before,
    dapo's normaliser counted only the kept tokens, scaling the update by N_all / N_kept."""
    kwargs = dict(loss_type=loss_type, rewards=["grpo_harness:first_group_only_reward"], micro_batch_size=3)
    unfiltered, _, _ = _gradients(skip_zero_advantage_rows=False, **kwargs)
    filtered, _, module = _gradients(skip_zero_advantage_rows=True, **kwargs)
    assert module.last_step.frac_reward_zero_std == 0.5  # one of the two groups is flat (1/2: exact)
    assert_same_gradients(filtered[0], unfiltered[0])


def test_num_iterations_is_one_step_per_batch():
    """Num_iterations=2 makes two optimizer updates per batch but one training step
    (global_step), so max_steps, evals and checkpoints do not depend on the data."""
    updates, trainer, module = _gradients(steps=3, num_iterations=2, epsilon_low=0.01, epsilon_high=0.01)
    assert trainer.global_step == 3
    assert len(updates) == 6, "two updates per step"
    assert module.last_step.step == 2
    ratio = module.last_step.loss["ratio_mean"]
    assert ratio != 1.0, "the second pass must see the updated policy against the old log-probs"


def test_dropout_is_off_when_scoring():
    """The policy scores its samples without dropout. With LoRA dropout 0.5 (and
    adapters moved off their zero init, so dropout matters) two train-mode passes give bit-identical
    log-probs after configure_model; with disable_dropout=False they differ (so the check can fail)."""
    from grpo_harness import fixed_rollout
    from rlcode.logprobs.sequence_logps import completion_logps

    rollout = fixed_rollout([0, 1], 4)

    def two_passes(**settings):
        module = build_module(lora={"r": 4, "alpha": 8, "dropout": 0.5}, **settings)
        with torch.no_grad():
            for name, parameter in module.policy.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(0.0, 0.5)
        module.policy.train()
        args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask, 1.0)
        with torch.no_grad():
            return completion_logps(module.policy, *args), completion_logps(module.policy, *args)

    torch.manual_seed(0)
    first, second = two_passes(disable_dropout=False)
    assert not torch.equal(first, second), "LoRA dropout 0.5 must make train-mode passes differ"
    first, second = two_passes()
    assert torch.equal(first, second)


def test_lora_dropout_defaults_to_zero():
    """Peft's LoRA dropout (0.05 before) is off by default."""
    from rlcode.models import LoraSettings

    assert LoraSettings().dropout == 0.0


def test_step_without_update_is_counted_without_touching_the_optimizer_under_fp16_scaling():
    """Under 16-mixed (V100) a step with no update (dry run, every group filtered)
    crashed in the GradScaler ("No inf checks were recorded"). The step is now counted without
    calling the optimizer. CPU has no fp16 autocast in Lightning, so the test drives the GradScaler
    path through a MixedPrecision plugin with a CPU GradScaler."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    plugin = MixedPrecision(precision="16-mixed", device="cpu", scaler=torch.amp.GradScaler("cpu"))
    module = build_module(rewards=["grpo_harness:constant_reward"], skip_zero_advantage_rows=True)
    start = {name: p.detach().clone() for name, p in module.policy.named_parameters()}
    trainer = fit_steps(module, steps=2, plugins=[plugin])
    assert trainer.global_step == 2 and not module.last_step.updated
    assert all(torch.equal(p, start[name]) for name, p in module.policy.named_parameters())


@pytest.mark.parametrize("settings", [
    {"loss_type": "grpo"}, {"loss_type": "bnpo"}, {"loss_type": "dr_grpo"},
    {"importance_sampling_level": "sequence", "num_iterations": 2},
    {"mask_truncated_completions": True},
])
def test_non_default_settings_train(settings):
    """Every loss type, GSPO and truncation masking run a real step that changes the weights."""
    module = build_module(**settings)
    start = {name: p.detach().clone() for name, p in module.policy.named_parameters()}
    fit_steps(module, steps=1)
    assert module.last_step.updated
    moved = [name for name, p in module.policy.named_parameters() if not torch.equal(p, start[name])]
    assert moved, f"{settings}: the weights did not change"
    if settings.get("mask_truncated_completions"):
        assert any(module.last_step.truncated), "the fixed rollouts include truncated rows"


def test_truncated_rows_get_no_gradient_when_masked():
    """mask_truncated_completions: a batch whose signal lies only in truncated rows has none left."""
    masked, _, _ = _gradients(mask_truncated_completions=True)
    unmasked, _, _ = _gradients(mask_truncated_completions=False)
    # float64 updates: a difference beyond exact_float64's rounding bound is a real one
    differs = [n for n, a in masked[0].items()
               if a is not None and float((a - unmasked[0][n]).abs().max()) > FLOAT64_TOLERANCE * float(a.abs().max())]
    assert differs, "masking truncated rows must change the update"


def test_reference_copy_is_kept_in_the_compute_dtype():
    """Under bf16-mixed the frozen reference (beta > 0, full fine-tuning) is bf16,
    not a second fp32 copy of the weights; the policy keeps fp32 master weights."""
    module = build_module(beta=0.04, configure=False)
    trainer = fit_steps(module, steps=1, precision="bf16-mixed")
    assert trainer.global_step == 1 and module.last_step.updated
    assert next(module._reference.parameters()).dtype == torch.bfloat16
    assert next(module.policy.parameters()).dtype == torch.float32
    assert build_module(beta=0.04)._reference.dtype == torch.float32  # built without a trainer: 32-true


def test_fsdp1_and_tensor_parallelism_are_refused_with_a_one_line_reason():
    """Lightning's FSDP1 wraps only the forward (a step generates and runs passes outside it) and a
    tensor-parallel mesh syncs nothing across data: refused at setup, naming rlcode's FSDP2."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

    module = build_module(configure=False)
    module._trainer = SimpleNamespace(strategy=FSDPStrategy())
    with pytest.raises(ValueError, match="FSDPStrategy \\(FSDP1\\).*--trainer.strategy fsdp"):
        module.setup("fit")
    tensor_parallel = ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2)
    module._trainer = SimpleNamespace(strategy=tensor_parallel)
    with pytest.raises(ValueError, match="tensor parallelism is not supported"):
        module.setup("fit")


def test_a_quantized_base_is_not_sharded():
    """FSDP2 cannot shard bitsandbytes' packed weights: a QLoRA policy under an FSDP mesh stops in one
    line naming DDP, before anything is loaded."""
    from rlcode.errors import SettingError

    module = build_module(configure=False, quantization="4bit", lora={"r": 4})
    module._device_mesh = object()  # what FSDP2Strategy sets before configure_model
    with pytest.raises(SettingError, match="cannot be sharded: use --trainer.strategy ddp with QLoRA"):
        module.configure_model()


def test_the_sandbox_opt_in_is_a_config_value(monkeypatch):
    """Where nothing hides the filesystem the pool refuses to start unless the user
    opts in; training passes the mode's sandbox.allow_visible_filesystem to every pool it builds."""
    import rlcode.training.run_context
    from rlcode.training.run_context import SandboxSettings

    seen = []

    class Recording:
        def __init__(self, **settings):
            seen.append(settings)

    monkeypatch.setattr(rlcode.training.run_context, "SandboxPool", Recording)
    module = build_module(configure=False, sandbox=SandboxSettings(workers=1, allow_visible_filesystem=True))
    module.sandbox_pool(3.0)
    module.sandbox_pool(3.0, workers=2)
    assert seen == [{"workers": 1, "timeout": 3.0, "allow_visible_filesystem": True},
                    {"workers": 2, "timeout": 3.0, "allow_visible_filesystem": True}]
