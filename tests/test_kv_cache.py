"""The preallocated cache layer: decoding writes in place and gives the same logits and completions."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

import rlcode.rollout.hf_backend as hf_backend
from rlcode.models import load_model, load_tokenizer
from rlcode.models.cache_name import cache_argument, output_cache
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt
from rlcode.rollout.kv_cache import PreallocatedLayer, preallocate

TEXTS = ["def add(a, b):", "Write a function that returns the sum of a list of numbers.", "class Stack:"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random").eval()


def _decode_logits(model, tokenizer, room: int | None, steps: int = 8) -> list[torch.Tensor]:
    """Greedy decode by hand; rows 1 and 4 leave after step 3. room None: transformers' own cache."""
    encoded = tokenizer([TEXTS[0], TEXTS[1]] * 3, padding=True, return_tensors="pt", add_special_tokens=False)
    mask = encoded["attention_mask"]
    positions = mask.cumsum(-1) - 1
    with torch.no_grad():
        output = model(**encoded, position_ids=positions.clamp_min(0), use_cache=True)
        cache = output_cache(output)
        if room is not None:
            assert preallocate(cache, room) == len(cache.layers)
        logits, position, seen = output.logits[:, -1], positions[:, -1:], []
        for step in range(steps):
            tokens = logits.argmax(-1, keepdim=True)
            if step == 3:
                keep = torch.tensor([0, 2, 3, 5])
                cache.batch_select_indices(keep)
                tokens, mask, position = tokens[keep], mask[keep], position[keep]
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
            position = position + 1
            logits = model(input_ids=tokens, attention_mask=mask, position_ids=position, use_cache=True,
                           **{cache_argument(model): cache}).logits[:, -1]
            seen.append(logits)
    return seen


def test_in_place_writes_give_the_same_logits_bit_for_bit(model, tokenizer):
    reference = _decode_logits(model, tokenizer, room=None)
    preallocated = _decode_logits(model, tokenizer, room=8)
    assert all(torch.equal(ours, theirs) for ours, theirs in zip(preallocated, reference))


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_the_backend_samples_the_same_completions_with_and_without_it(model, tokenizer, monkeypatch, lora):
    if lora:  # peft wraps the model; the cache still comes from the base model's layers
        from rlcode.models.adapters import LoraSettings, apply_lora

        model = apply_lora(load_model("tiny-random"), LoraSettings(r=4), quantized=False, gradient_checkpointing=False)
        with torch.no_grad():  # non-zero adapters, so they take part in every decode step
            for name, parameter in model.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(std=0.05, generator=torch.Generator().manual_seed(0))
        model.eval()
    prompts = [render_prompt(tokenizer, text, chat=True) for text in TEXTS]
    # many EOS ids: rows end at different steps, so finished rows leave the cache while others go on
    backend = HFGenerateBackend(model, tokenizer, eos_token_ids=list(range(0, tokenizer.vocab_size, 9)))
    params = SamplingParams(temperature=1.0, max_new_tokens=24, seed=3)
    converted = []
    monkeypatch.setattr(hf_backend, "preallocate", lambda cache, room: converted.append(preallocate(cache, room)))
    ours = backend.generate(prompts, 4, params)
    monkeypatch.setattr(hf_backend, "preallocate", lambda cache, room: 0)
    theirs = backend.generate(prompts, 4, params)
    assert converted and converted[0] > 0
    assert len(set(ours.completion_mask.sum(-1).tolist())) > 1  # rows did end at different lengths
    assert torch.equal(ours.completion_ids, theirs.completion_ids)
    assert ours.completion_texts == theirs.completion_texts


def test_a_write_past_the_room_is_refused():
    layer = PreallocatedLayer(torch.zeros(2, 1, 3, 4), torch.zeros(2, 1, 3, 4), room=1)
    keys, values = layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))
    assert keys.shape == (2, 1, 4, 4) and keys[:, :, -1].eq(1).all() and layer.get_seq_length() == 4
    with pytest.raises(RuntimeError, match="holds 4 tokens"):
        layer.update(torch.ones(2, 1, 1, 4), torch.ones(2, 1, 1, 4))


def test_other_layer_types_are_left_as_the_model_built_them():
    class Cache:
        layers = [DynamicSlidingWindowLayer(sliding_window=4), DynamicLayer()]

    cache = Cache()
    for layer in cache.layers:
        layer.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))
    assert preallocate(cache, room=3) == 1
    assert type(cache.layers[0]) is DynamicSlidingWindowLayer and type(cache.layers[1]) is PreallocatedLayer
    assert preallocate(object(), room=3) == 0
