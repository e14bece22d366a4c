"""``benchmarks/sampler_mismatch.py`` on the tiny random model: each side samples through the attention it
names (shared prompts or per-row SDPA), scores every completion token, and puts the switch back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import rlcode.rollout.quantized_sampler as quantized_sampler
from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import SamplingParams
from rlcode.rollout.shared_prompt_cache import SHARED_PROMPT_ATTENTION

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "sampler_mismatch.py"
sys.path.insert(0, str(_PATH.parent))
_spec = importlib.util.spec_from_file_location("sampler_mismatch", _PATH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_each_side_samples_through_its_attention_and_scores_every_token(monkeypatch):
    model, tokenizer = load_model("tiny-random").eval(), load_tokenizer("tiny-random")
    attentions = []
    copy_of = quantized_sampler.quantized_copy

    def recording_copy(policy, *args):
        copy_model, fallbacks = copy_of(policy, *args)
        attentions.append(copy_model.config._attn_implementation)
        return copy_model, fallbacks

    monkeypatch.setattr(quantized_sampler, "quantized_copy", recording_copy)
    switch = quantized_sampler.use_shared_prompt_attention
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    prompts = ["def add(a, b):", "class Stack:", "import os", "x = 1"]
    shared = bench.mismatch(model, tokenizer, prompts, 2, params, shared=True)
    per_row = bench.mismatch(model, tokenizer, prompts, 2, params, shared=False)
    assert attentions == [SHARED_PROMPT_ATTENTION, "sdpa"]
    assert quantized_sampler.use_shared_prompt_attention is switch
    for report in (shared, per_row):
        assert 0 < report["tokens"] <= 4 * 2 * 6
        assert 0 <= report["mean_abs_log_ratio"] <= report["max_abs_log_ratio"]
        assert 0 <= report["capped_share"] <= 1
