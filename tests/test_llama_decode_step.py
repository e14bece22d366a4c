"""The int8 sampler's llama-family decode step (``rlcode.rollout.llama_decode_step``): the logits of the
model's own forward bit for bit, for a qwen2 (q/k/v biases) and a llama model, with left padding, rows
and a whole prompt finishing, with the fused attention kernel and without it; the backend takes it only
where it is exact."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import rlcode.rollout.shared_prompt_cache as shared_prompt_cache
from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend
from rlcode.rollout.llama_decode_step import llama_decode_step, runs_llama_decode_step
from rlcode.rollout.quantized_sampler import quantized_copy

PROMPTS, GROUP, STEPS = 3, 4, 6


def tiny_llama():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def backend():
    return HFGenerateBackend(load_model("tiny-random").eval(), load_tokenizer("tiny-random"))


@torch.no_grad()
def decode_logits(backend, model, step) -> list[torch.Tensor]:
    """Per decode step, ``step``'s logits for GROUP rows per prompt (prompt 0 left-padded by 4), rows 1
    and 4..7 (all of prompt 1) finishing after step 3."""
    ids = torch.randint(3, 500, (PROMPTS, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    _, cache, positions = backend._prefill(model, ids, mask, GROUP, room=STEPS)
    mask, out = mask.repeat_interleave(GROUP, dim=0), []
    tokens = torch.arange(PROMPTS * GROUP * STEPS).view(-1, STEPS) % 500 + 3
    for index in range(STEPS):
        if index == 3:
            keep = torch.tensor([0, 2, 3, 8, 9, 10, 11])
            cache.batch_select_indices(keep)
            mask, positions, tokens = mask[keep], positions[keep], tokens[keep]
        mask, positions = torch.cat([mask, mask.new_ones(len(mask), 1)], dim=-1), positions + 1
        assert runs_llama_decode_step(model, cache)
        out.append(step(model, tokens[:, index], mask, positions, cache))
    return out


@pytest.mark.parametrize("kernel", [True, False], ids=["fused attention", "torch attention"])
@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_the_step_gives_the_forwards_logits_bit_for_bit(backend, architecture, kernel, monkeypatch):
    if not kernel:  # as where the fused kernel cannot be built
        monkeypatch.setattr(shared_prompt_cache, "fused_attention_kernel", lambda: None)
    policy = backend.model if architecture == "qwen2" else tiny_llama()
    assert policy.config.model_type == architecture
    int8, _ = quantized_copy(policy)
    expected = decode_logits(backend, int8, backend._forward_step)  # the model's own forward
    got = decode_logits(backend, int8, llama_decode_step)
    assert [logits.shape[0] for logits in got] == [12, 12, 12, 7, 7, 7]
    for index, (left, right) in enumerate(zip(expected, got)):
        assert torch.equal(left, right), index


@torch.no_grad()
def test_the_backend_takes_the_step_only_where_it_is_exact(backend):
    policy = backend.model
    int8, _ = quantized_copy(policy)
    ids = torch.randint(3, 500, (2, 5), generator=torch.Generator().manual_seed(2))
    _, shared_cache, _ = backend._prefill(int8, ids, torch.ones_like(ids), GROUP, room=2)
    _, per_row_cache, _ = backend._prefill(policy, ids, torch.ones_like(ids), GROUP, room=2)
    assert runs_llama_decode_step(int8, shared_cache)
    assert not runs_llama_decode_step(policy, per_row_cache)  # the policy samples through its forward
    assert not runs_llama_decode_step(int8, per_row_cache)
    sliding = quantized_copy(policy)[0]
    sliding.config.layer_types = ["sliding_attention"] * len(sliding.config.layer_types)
    gelu = quantized_copy(policy)[0]
    gelu.config.hidden_act = "gelu"
    other = quantized_copy(policy)[0]
    other.config.model_type = "qwen3"  # q/k norms this step does not apply
    assert not any(runs_llama_decode_step(model, shared_cache) for model in (sliding, gelu, other))
