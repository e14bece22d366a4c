"""The optimizer setting: torch's AdamW, bitsandbytes' 8-bit AdamW, and the refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from grpo_harness import build_module, fit_steps
from rlcode.errors import SettingError
from rlcode.training.optimizers import build_optimizer


def test_adamw_8bit_keeps_one_byte_moments_and_trains():
    module = build_module(optimizer="adamw_8bit", learning_rate=1e-3)
    before = {name: p.detach().clone() for name, p in module.policy.named_parameters()}
    fit_steps(module)
    optimizer = module.optimizers().optimizer
    assert type(optimizer).__module__.startswith("bitsandbytes") and type(optimizer).__name__ == "AdamW8bit"
    states = [optimizer.state[p] for p in module.policy.parameters() if p.numel() >= 4096 and p in optimizer.state]
    assert states and all(state["state1"].dtype == torch.uint8 for state in states)
    assert any(not torch.equal(before[name], p) for name, p in module.policy.named_parameters())


def test_adamw_is_torch_adamw():
    parameter = torch.nn.Parameter(torch.zeros(3))
    optimizer = build_optimizer("adamw", [parameter], lr=1e-3, weight_decay=0.1, sharded=False)
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["weight_decay"] == 0.1


def test_adamw_8bit_under_fsdp_and_unknown_names_are_refused_in_one_line():
    parameter = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(SettingError, match="cannot run under --trainer.strategy fsdp") as refused:
        build_optimizer("adamw_8bit", [parameter], lr=1e-3, weight_decay=0.0, sharded=True)
    assert "\n" not in str(refused.value)
    with pytest.raises(SettingError, match="use adamw or adamw_8bit"):
        build_optimizer("sgd", [parameter], lr=1e-3, weight_decay=0.0, sharded=False)


def test_adamw_8bit_state_resumes_exactly():
    """A checkpoint's optimizer state loaded into a new 8-bit AdamW gives the very next step."""
    generator = torch.Generator().manual_seed(0)
    start = torch.randn(64, 128, generator=generator)
    gradients = [torch.randn(64, 128, generator=generator) for _ in range(3)]

    def run(parameter, optimizer, grads):
        for grad in grads:
            parameter.grad = grad.clone()
            optimizer.step()

    a = torch.nn.Parameter(start.clone())
    first = build_optimizer("adamw_8bit", [a], lr=1e-2, weight_decay=0.0, sharded=False)
    run(a, first, gradients[:2])
    saved_weights, saved_state = a.detach().clone(), copy.deepcopy(first.state_dict())  # as a checkpoint holds it
    run(a, first, gradients[2:])

    b = torch.nn.Parameter(saved_weights)
    second = build_optimizer("adamw_8bit", [b], lr=1e-2, weight_decay=0.0, sharded=False)
    second.load_state_dict(saved_state)
    run(b, second, gradients[2:])
    assert torch.equal(a, b)
