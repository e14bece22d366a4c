"""Generation under a training step's autocast (weight cache off, as Lightning's AMP plugin runs it)
casts each weight once per call, not once per token, and keeps no cast copy after the call."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt
from rlcode.rollout import cast_once


class WeightCasts(TorchDispatchMode):
    """Counts casts (``aten._to_copy``) whose source is one of the given weights."""

    def __init__(self, weights) -> None:
        super().__init__()
        self.weights, self.casts = {id(w) for w in weights}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default and id(args[0]) in self.weights:
            self.casts += 1
        return func(*args, **(kwargs or {}))


def _casts(monkeypatch, cast_once_on: bool, tokens: int) -> tuple[int, int]:
    if not cast_once_on:
        monkeypatch.setattr(cast_once.torch, "clear_autocast_cache", lambda: None)
        monkeypatch.setattr("rlcode.rollout.hf_backend.weights_cast_once", lambda device_type: _nothing())
    model, tokenizer = load_model("tiny-random"), load_tokenizer("tiny-random")
    linears = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    prompts = [render_prompt(tokenizer, "def add(a, b):", chat=True)]
    params = SamplingParams(temperature=0, max_new_tokens=tokens, seed=0, stop=[])
    counter = WeightCasts(linears)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), counter:  # Lightning's bf16-mixed
        batch = HFGenerateBackend(model, tokenizer, eos_token_ids=[tokenizer.vocab_size + 7]).generate(prompts, 2, params)
    assert batch.completion_mask.sum() == 2 * tokens  # no row ended early: every step ran
    return counter.casts, len(linears)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_each_weight_is_cast_once_per_generate_call(monkeypatch):
    casts, linears = _casts(monkeypatch, cast_once_on=True, tokens=6)
    assert casts == linears  # the prefill casts each; the 5 decode steps reuse the casts


def test_without_it_every_token_casts_every_weight_again(monkeypatch):
    """The defect the context removes, shown on the same count (so the test above can fail)."""
    casts, linears = _casts(monkeypatch, cast_once_on=False, tokens=6)
    assert casts == 6 * linears


def test_the_cache_is_cleared_after_the_call(monkeypatch):
    cleared = []
    monkeypatch.setattr(cast_once.torch, "clear_autocast_cache", lambda: cleared.append(1))
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        with cast_once.weights_cast_once("cpu"):
            assert torch.is_autocast_cache_enabled()
        assert not torch.is_autocast_cache_enabled() and cleared == [1]  # before the outer context ends
    with cast_once.weights_cast_once("cpu"):  # no autocast: nothing to cache, nothing entered
        assert not torch.is_autocast_enabled("cpu")
