"""The HF rollout backend on the tiny random model: layout, masks, flags, stop strings, seeds, and its
in-place KV cache (the same logits and completions as transformers' own)."""

import pytest
import torch
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

import rlcode.rollout.hf_backend as hf_backend
from rlcode.models import load_model, load_tokenizer
from rlcode.models.cache_name import cache_argument, output_cache
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt
from rlcode.rollout.kv_cache import PreallocatedLayer, preallocate
from rlcode.rollout.sampling import filter_logits, next_tokens

TEXTS = ["def add(a, b):", "Write a function that returns the sum of a list of numbers.", "class Stack:"]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random").eval()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [render_prompt(tokenizer, text, chat=True) for text in TEXTS]


def greedy(max_new_tokens, **extra):
    return SamplingParams(temperature=0, max_new_tokens=max_new_tokens, **extra)


def reference_greedy(model, tokenizer, prompts, max_new_tokens):
    encoded = tokenizer(prompts, padding=True, return_tensors="pt", add_special_tokens=False)
    output = model.generate(**encoded, do_sample=False, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    return output[:, encoded["input_ids"].shape[1]:]


def test_sampling_params_reject_bad_values():
    for bad in (dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(max_new_tokens=0), dict(stop=[""])):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


def test_render_prompt_chat_and_plain(tokenizer):
    assert render_prompt(tokenizer, "hi", chat=False) == "hi"
    assert render_prompt(tokenizer, "hi", chat=True) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert render_prompt(tokenizer, messages, chat=True).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert render_prompt(tokenizer, messages, chat=False) == "Be brief.\n\nhi"


def test_render_prompt_without_template_says_so(tokenizer):
    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        render_prompt(NoTemplate(), "hi", chat=True)


def test_layout_groups_padding_and_masks(model, tokenizer, prompts):
    group, limit = 3, 12
    batch = HFGenerateBackend(model, tokenizer).generate(prompts, group, SamplingParams(max_new_tokens=limit, seed=0))
    rows = len(prompts) * group
    assert batch.prompt_ids.shape[0] == batch.completion_ids.shape[0] == rows == len(batch)
    assert batch.completion_ids.shape == batch.completion_mask.shape and batch.completion_ids.shape[1] <= limit
    for index, prompt in enumerate(prompts):
        expected = tokenizer(prompt, add_special_tokens=False).input_ids
        for row in range(index * group, index * group + group):
            mask = batch.prompt_mask[row]
            assert batch.prompt_ids[row][mask.bool()].tolist() == expected  # round trip
            assert (batch.prompt_ids[row][~mask.bool()] == tokenizer.pad_token_id).all()
            assert mask.tolist() == sorted(mask.tolist())  # left padding: zeros then ones
    assert (batch.prompt_mask[:, -1] == 1).all()
    for row in range(rows):
        mask = batch.completion_mask[row].tolist()
        length = sum(mask)
        assert mask == [1] * length + [0] * (len(mask) - length)  # ones then zeros
        assert (batch.completion_ids[row, length:] == tokenizer.pad_token_id).all()
        kept = batch.completion_ids[row, :length].tolist()
        ends_with_eos = kept[-1] == tokenizer.eos_token_id
        assert tokenizer.eos_token_id not in kept[:-1]
        assert bool(batch.truncated[row]) == (not ends_with_eos)
        assert bool(batch.truncated[row]) == (length == limit)
        assert batch.completion_texts[row] == tokenizer.decode(kept, skip_special_tokens=True)
    assert batch.num_generated_tokens == int(batch.completion_mask.sum())


def test_greedy_matches_transformers_generate(model, tokenizer, prompts):
    limit = 24
    batch = HFGenerateBackend(model, tokenizer).generate(prompts, 1, greedy(limit))
    reference = reference_greedy(model, tokenizer, prompts, limit)
    for row in range(len(prompts)):
        length = int(batch.completion_mask[row].sum())
        assert batch.completion_ids[row, :length].tolist() == reference[row, :length].tolist()
    # One prompt of the tiny model answers EOS at once, the others run to the limit: both paths covered.
    assert batch.truncated.tolist() == [True, False, True]
    assert batch.completion_ids[1, 0] == tokenizer.eos_token_id


def test_custom_eos_ends_a_row_and_clears_its_truncated_flag(model, tokenizer, prompts):
    reference = reference_greedy(model, tokenizer, prompts[:1], 10)[0].tolist()
    stop_token = next(token for position, token in enumerate(reference) if position >= 3 and token not in reference[:position])
    end = reference.index(stop_token) + 1
    backend = HFGenerateBackend(model, tokenizer, eos_token_ids=[stop_token])
    batch = backend.generate(prompts[:1], 2, greedy(10))
    assert batch.completion_mask.sum(-1).tolist() == [end, end]
    assert batch.completion_ids[0, :end].tolist() == reference[:end]
    assert batch.completion_ids.shape[1] == end  # columns that are padding everywhere are dropped
    assert not batch.truncated.any()


def test_stop_string_ends_the_row_and_cuts_the_text(model, tokenizer, prompts):
    backend = HFGenerateBackend(model, tokenizer)
    full = backend.generate(prompts[:1], 1, greedy(16))
    text = full.completion_texts[0]
    stop = text[5:8]
    assert stop and stop not in text[:7]
    batch = backend.generate(prompts[:1], 1, greedy(16, stop=[stop, "never-appears-here"]))
    length = int(batch.completion_mask[0].sum())
    assert length < 16 and not batch.truncated[0]
    assert batch.completion_texts[0] == text[: text.index(stop) + len(stop)]
    assert batch.completion_ids[0, :length].tolist() == full.completion_ids[0, :length].tolist()
    assert stop not in tokenizer.decode(batch.completion_ids[0, : length - 1])  # stopped at the first chance


def test_seed_makes_sampling_reproducible(model, tokenizer, prompts):
    backend = HFGenerateBackend(model, tokenizer)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=16, seed=123)
    first = backend.generate(prompts, 4, params)
    second = backend.generate(prompts, 4, params)
    other = backend.generate(prompts, 4, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=16, seed=124))
    assert torch.equal(first.completion_ids, second.completion_ids)
    assert first.completion_texts == second.completion_texts
    assert not torch.equal(first.completion_ids[:, :4], other.completion_ids[:, :4])
    # Rows of one group are different samples, not copies.
    assert len({tuple(row) for row in first.completion_ids[:4].tolist()}) > 1


def test_generation_restores_training_mode(model, tokenizer, prompts):
    model.train()
    try:
        HFGenerateBackend(model, tokenizer).generate(prompts[:1], 1, greedy(2))
        assert model.training
    finally:
        model.eval()


def test_rollout_tensors_feed_a_training_forward_and_backward(model, tokenizer, prompts):
    batch = HFGenerateBackend(model, tokenizer).generate(prompts[:2], 2, SamplingParams(max_new_tokens=6, seed=0))
    input_ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    model.train()
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
        logits[:, -batch.completion_ids.shape[1]:].logsumexp(-1).mean().backward()
    finally:
        model.zero_grad(set_to_none=True)
        model.eval()
    assert not batch.completion_ids.is_inference()


def test_bad_calls_are_rejected(model, tokenizer):
    backend = HFGenerateBackend(model, tokenizer)
    with pytest.raises(ValueError, match="no prompts"):
        backend.generate([], 1, greedy(2))
    with pytest.raises(ValueError, match="num_generations"):
        backend.generate(["x"], 0, greedy(2))


def _assert_frequencies(counts, expected, draws: int) -> None:
    """Token frequencies over ``draws`` independent samples within 6 standard deviations of the
    expected probabilities p (a frequency's std is sqrt(p (1 - p) / draws); 6 of them are exceeded
    with probability ~2e-9 per token; a token with p = 0 must never be drawn)."""
    expected = expected.double()
    bound = 6 * (expected * (1 - expected) / draws).sqrt()
    assert bool(((counts.double() / draws - expected).abs() <= bound).all()), (counts / draws, expected)


def test_gumbel_sampling_follows_softmax():
    generator = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(100_000, 1)
    counts = torch.bincount(next_tokens(logits, 1.0, 0, 1.0, generator), minlength=4)
    _assert_frequencies(counts, torch.softmax(logits[0], -1), 100_000)
    hot = torch.bincount(next_tokens(logits, 0.5, 0, 1.0, generator), minlength=4)
    _assert_frequencies(hot, torch.softmax(logits[0] / 0.5, -1), 100_000)
    top_two = torch.bincount(next_tokens(logits, 1.0, 2, 1.0, generator), minlength=4)
    assert top_two[0] == top_two[3] == 0 and top_two[1] > 0


def test_top_p_keeps_the_smallest_set_reaching_p():
    generator = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(50_000, 1)
    counts = torch.bincount(next_tokens(logits, 1.0, 0, 0.7, generator), minlength=4)
    _assert_frequencies(counts, torch.tensor([0.625, 0.375, 0.0, 0.0]), 50_000)


def test_top_p_shortcut_equals_a_full_sort(monkeypatch):
    import rlcode.rollout.sampling as sampling

    logits = torch.randn(4, 5000, generator=torch.Generator().manual_seed(0)) * 6
    kept, token_ids = filter_logits(logits, 0, 0.9)
    assert token_ids is not None  # the peaked rows took the shortcut
    shortcut = torch.full_like(logits, float("-inf")).scatter(-1, token_ids, kept)
    monkeypatch.setattr(sampling, "_NUCLEUS_PROBE", 10**9)
    full, no_ids = filter_logits(logits, 0, 0.9)
    assert no_ids is None
    assert torch.equal(torch.isinf(shortcut), torch.isinf(full))


@pytest.mark.integration
def test_smollm2_writes_python_for_a_chat_prompt():
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct").eval()
    prompt = render_prompt(tokenizer, "Write a Python function that adds two numbers. Use a ```python block.", chat=True)
    batch = HFGenerateBackend(model, tokenizer).generate([prompt], 1, greedy(48))
    text = batch.completion_texts[0]
    assert "def " in text, text
    assert "<|im_start|>" not in text


def test_top_p_shortcut_uses_the_full_distribution(monkeypatch):
    import rlcode.rollout.sampling as sampling

    # The best 2 of 4 tokens hold 88% >= top_p, so the shortcut applies; the nucleus is still both
    # tokens (0.64 < 0.7), which renormalizing over the 2 candidates alone would get wrong.
    monkeypatch.setattr(sampling, "_NUCLEUS_PROBE", 2)
    generator = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(50_000, 1)
    counts = torch.bincount(next_tokens(logits, 1.0, 0, 0.7, generator), minlength=4)
    probabilities = torch.softmax(logits[0], -1)
    expected = torch.tensor([0.0, probabilities[1], probabilities[2], 0.0]) / (probabilities[1] + probabilities[2])
    _assert_frequencies(counts, expected, 50_000)


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
