"""The shared-prompt cache (``rlcode.rollout.shared_prompt_cache``): each prompt's keys and values kept
once for its group give SDPA's attention over the per-row cache, with padding, with rows and whole
prompts finished; the cache layer writes in place and drops finished prompts; the HF backend decoding
through it gives the per-row cache's logits; the int8 copy uses it and the policy keeps its own."""

import copy

import pytest
import torch
import torch.nn.functional as F

from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend
from rlcode.rollout.quantized_sampler import quantized_copy
from rlcode.rollout.shared_prompt_cache import (SHARED_PROMPT_ATTENTION, SharedPromptLayer, group_mask,
                                          grouped_decode_attention, shares_prompt_cache, use_shared_prompt_attention)

PROMPTS, GROUP, KV_HEADS, PER_KV, PREFIX, SUFFIX, HEAD_DIM = 3, 4, 2, 3, 11, 5, 16
ROWS = PROMPTS * GROUP
EPS = torch.finfo(torch.float32).eps


def reordering_bound(scores: torch.Tensor, values: torch.Tensor) -> float:
    """How far two fp32 evaluations of the same attention may differ when their sums run in another order:
    each score is a dot product of HEAD_DIM terms (error <= HEAD_DIM * eps * |score terms|, which moves a
    softmax weight by that much relatively), and each output sums P + S weighted values (<= (P + S) *
    eps * max|v|); both counted twice (either side may err)."""
    keys = scores.shape[-1]
    return 2 * (keys + 2 * HEAD_DIM * float(scores.abs().max())) * EPS * float(values.abs().max())


@pytest.fixture
def tensors():
    generator = torch.Generator().manual_seed(0)
    normal = lambda *shape: torch.randn(*shape, generator=generator)  # noqa: E731
    query = normal(ROWS, KV_HEADS * PER_KV, 1, HEAD_DIM)
    prefix_keys, prefix_values = normal(PROMPTS, KV_HEADS, PREFIX, HEAD_DIM), normal(PROMPTS, KV_HEADS, PREFIX, HEAD_DIM)
    suffix_keys, suffix_values = normal(ROWS, KV_HEADS, SUFFIX, HEAD_DIM), normal(ROWS, KV_HEADS, SUFFIX, HEAD_DIM)
    mask = torch.ones(ROWS, 1, 1, PREFIX + SUFFIX, dtype=torch.bool)
    mask[:GROUP, ..., :3] = False  # the first prompt is left-padded by 3
    return query, prefix_keys, prefix_values, suffix_keys, suffix_values, mask


def sdpa_reference(query, prefix_keys, prefix_values, suffix_keys, suffix_values, mask, rows, prompts):
    """SDPA over the per-row cache (each row's prompt repeated, then its suffix): [B, 1, Hq, D] and the scores."""
    keys = torch.cat([prefix_keys[prompts], suffix_keys[rows]], dim=2)
    values = torch.cat([prefix_values[prompts], suffix_values[rows]], dim=2)
    output = F.scaled_dot_product_attention(query[rows], keys, values, attn_mask=None if mask is None else mask[rows],
                                            scale=HEAD_DIM ** -0.5, enable_gqa=True)
    scores = torch.matmul(query[rows], keys.repeat_interleave(PER_KV, dim=1).transpose(-1, -2)) * HEAD_DIM ** -0.5
    return output.transpose(1, 2), scores, values


@pytest.mark.parametrize("mask_kind", ["bool", "float", "none"])
def test_grouped_attention_equals_sdpa_over_the_per_row_cache(tensors, mask_kind):
    query, prefix_keys, prefix_values, suffix_keys, suffix_values, mask = tensors
    if mask_kind == "float":
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    elif mask_kind == "none":
        mask = None
    rows = torch.arange(ROWS)
    reference, scores, values = sdpa_reference(query, prefix_keys, prefix_values, suffix_keys, suffix_values, mask,
                                               rows, rows // GROUP)
    output = grouped_decode_attention(query, prefix_keys, prefix_values, suffix_keys, suffix_values, rows, GROUP,
                                      group_mask(mask, rows, PROMPTS, GROUP, PER_KV), HEAD_DIM ** -0.5)
    assert output.shape == reference.shape == (ROWS, 1, KV_HEADS * PER_KV, HEAD_DIM)
    assert (output - reference).abs().max() <= reordering_bound(scores, values)


def test_rows_and_a_whole_prompt_that_finished_leave_the_attention(tensors):
    query, prefix_keys, prefix_values, suffix_keys, suffix_values, mask = tensors
    layer = SharedPromptLayer(prefix_keys, prefix_values, GROUP, room=SUFFIX)
    layer.update(suffix_keys, suffix_values)
    live = torch.tensor([0, 2, 3, 9, 11])  # prompt 0: 3 rows, prompt 1: none, prompt 2: 2 rows
    layer.batch_select_indices(live)
    assert layer.prefix_keys.shape[0] == 2  # prompt 1's keys are no longer read
    assert layer.slots.tolist() == [0, 2, 3, 5, 7]  # prompt 2 is now the second prompt
    reference, scores, values = sdpa_reference(query, prefix_keys, prefix_values, suffix_keys, suffix_values, mask,
                                               live, live // GROUP)
    output = grouped_decode_attention(query[live], layer.prefix_keys, layer.prefix_values, layer.keys, layer.values,
                                      layer.slots, GROUP, group_mask(mask[live], layer.slots, 2, GROUP, PER_KV),
                                      HEAD_DIM ** -0.5)
    assert (output - reference).abs().max() <= reordering_bound(scores, values)


def test_the_layer_writes_generated_tokens_in_place_and_counts_the_prompt(tensors):
    _, prefix_keys, prefix_values, suffix_keys, suffix_values, _ = tensors
    layer = SharedPromptLayer(prefix_keys, prefix_values, GROUP, room=SUFFIX)
    buffer = layer._key_buffer.data_ptr()
    for step in range(SUFFIX):
        keys, values = layer.update(suffix_keys[:, :, step:step + 1], suffix_values[:, :, step:step + 1])
        assert layer.get_seq_length() == PREFIX + step + 1
        assert layer.get_mask_sizes(1) == (PREFIX + step + 2, 0)
    assert torch.equal(keys, suffix_keys) and torch.equal(values, suffix_values)
    assert layer._key_buffer.data_ptr() == buffer  # no reallocation while decoding
    with pytest.raises(RuntimeError, match="holds 5 tokens"):
        layer.update(suffix_keys[:, :, :1], suffix_values[:, :, :1])


@torch.no_grad()
def decode_logits(backend, model, ids, mask, drop_at: int, steps: int) -> list[torch.Tensor]:
    """Logits of the backend's prefill and decode steps for GROUP rows per prompt, rows 1, 4..7 (all of
    prompt 1) finishing after step ``drop_at``."""
    logits, cache, positions = backend._prefill(model, ids, mask, GROUP, room=steps)
    mask, out = mask.repeat_interleave(GROUP, dim=0), [logits]
    tokens = torch.arange(ROWS * steps).view(ROWS, steps) % 500 + 3
    for step in range(steps):
        if step == drop_at:
            keep = torch.tensor([0, 2, 3, 8, 9, 10, 11])
            cache.batch_select_indices(keep)
            mask, positions, tokens = mask[keep], positions[keep], tokens[keep]
        mask, positions = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=-1), positions + 1
        out.append(backend._decode_step(model, tokens[:, step], mask, positions, cache))
    return out


def test_the_backend_decoding_through_it_gives_the_per_row_caches_logits():
    model = load_model("tiny-random").eval()
    shared = copy.deepcopy(model)
    assert use_shared_prompt_attention(shared) and shares_prompt_cache(shared) and not shares_prompt_cache(model)
    backend = HFGenerateBackend(model, load_tokenizer("tiny-random"))
    ids = torch.randint(3, 500, (PROMPTS, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    expected = decode_logits(backend, model, ids, mask, drop_at=3, steps=6)
    got = decode_logits(backend, shared, ids, mask, drop_at=3, steps=6)
    # Per step: logits within the reordering error of the attention carried through the model; for
    # this 2-layer model with logits of size ~1 a bound of 1e4 x eps (about 1e-3) is generous and
    # still fails for any wrong key, mask or row (those move logits by ~1e-1).
    for step, (left, right) in enumerate(zip(expected, got)):
        assert left.shape == right.shape
        assert (left - right).abs().max() <= 1e4 * EPS * max(1.0, float(left.abs().max())), step


def test_the_int8_copy_decodes_with_shared_prefixes_and_the_policy_keeps_sdpa():
    policy = load_model("tiny-random").eval()
    before = policy.config._attn_implementation
    copy_model, _ = quantized_copy(policy)
    assert copy_model.config._attn_implementation == SHARED_PROMPT_ATTENTION
    assert policy.config._attn_implementation == before == "sdpa"
    eager = load_model("tiny-random").eval()
    eager.config._attn_implementation = "eager"
    assert not use_shared_prompt_attention(eager)  # a user's other attention choice stays
    other = load_model("tiny-random").eval()
    other.config.model_type = "gemma2"  # soft-capped attention: the grouped attention would drop the cap
    assert not use_shared_prompt_attention(other) and other.config._attn_implementation == "sdpa"
