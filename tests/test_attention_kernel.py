"""The fused decode-attention kernel (``rlcode.rollout.attention_kernel``): it builds here, equals SDPA over
the per-row cache up to float rounding (head sizes on the vector paths and the generic one, left
padding, rows and a whole prompt finished), and where it cannot be built one log line says so and the
torch attention decodes."""

import logging

import pytest
import torch
import torch.nn.functional as F

import rlcode.rollout.attention_kernel as attention_kernel
from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend, SamplingParams
from rlcode.rollout.shared_prompt_cache import SharedPromptLayer, fused_decode_attention

PROMPTS, GROUP, KV_HEADS, PREFIX, SUFFIX = 3, 4, 2, 21, 5
EPS = torch.finfo(torch.float32).eps


def sdpa_reference(query, layer_inputs, mask, rows):
    """SDPA over the per-row cache (each row's prompt, then its generated tokens) and the scores' size."""
    prefix_keys, prefix_values, suffix_keys, suffix_values = layer_inputs
    prompts, head_dim = rows // GROUP, query.shape[-1]
    keys = torch.cat([prefix_keys[prompts], suffix_keys[rows]], dim=2)
    values = torch.cat([prefix_values[prompts], suffix_values[rows]], dim=2)
    output = F.scaled_dot_product_attention(query[rows], keys, values, attn_mask=mask[rows][:, None, None, :],
                                            scale=head_dim ** -0.5, enable_gqa=True)
    per_kv = query.shape[1] // KV_HEADS
    scores = torch.matmul(query[rows], keys.repeat_interleave(per_kv, dim=1).transpose(-1, -2)) * head_dim ** -0.5
    return output.transpose(1, 2), scores, values


def rounding_bound(scores, values, head_dim: int) -> float:
    """Two fp32 evaluations of one attention, their sums in other orders: a score is a dot product of
    head_dim terms (error <= head_dim eps |terms|, moving its softmax weight by that much relatively),
    the kernel's exp is a degree-7 polynomial (truncation 5e-9, below eps; ~8 roundings), and an output
    sums P + S weighted values (<= (P + S) eps max|v|); counted for both sides."""
    keys = scores.shape[-1]
    return 2 * (keys + 2 * head_dim * float(scores.abs().max()) + 8) * EPS * float(values.abs().max())


def layer_inputs(head_dim: int, per_kv: int):
    generator = torch.Generator().manual_seed(head_dim + per_kv)
    normal = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    query = normal(PROMPTS * GROUP, KV_HEADS * per_kv, 1, head_dim)
    return query, (normal(PROMPTS, KV_HEADS, PREFIX, head_dim), normal(PROMPTS, KV_HEADS, PREFIX, head_dim),
                   normal(PROMPTS * GROUP, KV_HEADS, SUFFIX, head_dim), normal(PROMPTS * GROUP, KV_HEADS, SUFFIX, head_dim))


def test_the_kernel_is_built_on_this_machine():
    assert attention_kernel.fused_attention_kernel() is not None  # CI has a compiler: the fast path is tested


@pytest.mark.parametrize("head_dim, per_kv", [(64, 3), (128, 2), (16, 4)])  # 64/128: vector paths; 16: generic
@pytest.mark.parametrize("finished", [False, True])
def test_the_kernel_equals_sdpa_over_the_per_row_cache(head_dim, per_kv, finished):
    query, inputs = layer_inputs(head_dim, per_kv)
    prefix_keys, prefix_values, suffix_keys, suffix_values = inputs
    mask = torch.ones(PROMPTS * GROUP, PREFIX + SUFFIX, dtype=torch.bool)
    mask[:GROUP, :3] = False  # the first prompt is left-padded by 3
    layer = SharedPromptLayer(prefix_keys, prefix_values, GROUP, room=SUFFIX)
    layer.update(suffix_keys, suffix_values)
    rows = torch.arange(PROMPTS * GROUP)
    if finished:  # prompt 0 keeps 3 rows, prompt 1 none (its keys leave), prompt 2 keeps 2
        rows = torch.tensor([0, 2, 3, 9, 11])
        layer.prefix_keys_transposed()  # made before the prompt leaves: it must leave that layout too
        layer.batch_select_indices(rows)
    output = fused_decode_attention(query[rows], layer, layer.keys, layer.values, mask[rows], head_dim ** -0.5)
    reference, scores, values = sdpa_reference(query, inputs, mask, rows)
    assert output.shape == reference.shape == (len(rows), 1, KV_HEADS * per_kv, head_dim)
    assert (output - reference).abs().max() <= rounding_bound(scores, values, head_dim)


def test_rows_out_of_prompt_order_are_left_to_the_torch_attention():
    query, (prefix_keys, prefix_values, suffix_keys, suffix_values) = layer_inputs(64, 3)
    layer = SharedPromptLayer(prefix_keys, prefix_values, GROUP, room=SUFFIX)
    layer.update(suffix_keys, suffix_values)
    layer.slots = layer.slots.flip(0)
    assert fused_decode_attention(query, layer, layer.keys, layer.values, None, 0.125) is None


def test_the_kernel_refuses_prompt_indices_it_cannot_walk():
    query, (prefix_keys, prefix_values, suffix_keys, suffix_values) = layer_inputs(64, 3)
    layer = SharedPromptLayer(prefix_keys, prefix_values, GROUP, room=SUFFIX)
    kernel = attention_kernel.fused_attention_kernel()
    grouped_query = query.reshape(PROMPTS * GROUP, KV_HEADS, 3, 64)
    for prompts in (torch.arange(PROMPTS * GROUP) // GROUP + 1, torch.arange(PROMPTS * GROUP).flip(0) // GROUP):
        with pytest.raises(RuntimeError, match="rows in prompt order"):  # past the last prompt; out of order
            kernel.shared_prompt_attention(grouped_query, layer.prefix_keys_transposed(), layer.prefix_values,
                                           suffix_keys, suffix_values, prompts, torch.empty(0, dtype=torch.bool), 0.125)


def test_without_a_compiler_one_log_line_and_the_torch_attention_decodes(monkeypatch, caplog):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions\nerror: no C++ compiler")

    monkeypatch.setattr("torch.utils.cpp_extension.load", no_compiler)
    attention_kernel.fused_attention_kernel.cache_clear()
    try:
        backend = HFGenerateBackend(load_model("tiny-random").eval(), load_tokenizer("tiny-random"),
                                    rollout_precision="int8")
        with caplog.at_level(logging.WARNING, logger="rlcode.rollout.attention_kernel"):
            first = backend.generate(["def add(a, b):"], 2, SamplingParams(temperature=0.0, max_new_tokens=4))
            backend.generate(["class Stack:"], 2, SamplingParams(temperature=0.0, max_new_tokens=4))
        lines = [record.getMessage() for record in caplog.records if record.name == "rlcode.rollout.attention_kernel"]
        assert len(lines) == 1 and "could not be built" in lines[0] and "no C++ compiler" in lines[0]
        assert first.completion_ids.shape[0] == 2
    finally:
        attention_kernel.fused_attention_kernel.cache_clear()  # later tests load the built kernel again


def test_a_build_is_announced_before_it_starts_and_a_cached_one_is_not(monkeypatch, capsys):
    """The first int8 step sat ~50 s with no word while the kernel built."""
    assert attention_kernel.fused_attention_kernel() is not None
    name = f"rlcode_shared_prompt_attention_{attention_kernel._build_key()}"
    assert attention_kernel._built(name), "the cache check must find the build just made (torch moved it?)"
    import torch.utils.cpp_extension as cpp_extension

    for cached, announced in ((True, False), (False, True)):
        attention_kernel.fused_attention_kernel.cache_clear()
        monkeypatch.setattr(attention_kernel, "_built", lambda _name, cached=cached: cached)
        monkeypatch.setattr(cpp_extension, "load", lambda **kwargs: object())
        capsys.readouterr()
        assert attention_kernel.fused_attention_kernel() is not None
        assert ("building its fused decode-attention kernel" in capsys.readouterr().out) is announced
    attention_kernel.fused_attention_kernel.cache_clear()
