"""Completion log-probs: the chunked fused head against the models' own logits, positions of
left-padded rows, what is kept for backward, and the fallback for heads that cannot be fused.

Equalities run the models in float64 (``exact_float64``): the paths agree to rounding there."""

from __future__ import annotations

import logging

import pytest
import torch

from exact_float64 import assert_float64_equal, in_float64
from rlcode.logprobs import sequence_logps
from rlcode.logprobs.sequence_logps import completion_logps, position_ids

TEMPERATURE = 0.7


def _tiny(architecture: str, vocab_size: int = 300, **extra):
    """A random 1-layer model of ``architecture`` (transformers config + class names)."""
    import transformers

    config_class = getattr(transformers, f"{architecture}Config")
    model_class = getattr(transformers, f"{architecture}ForCausalLM")
    config = config_class(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                          pad_token_id=0, **extra)
    torch.manual_seed(0)
    return model_class(config).eval()


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=64,
                                              bos_token_id=1, eos_token_id=1)).eval()


MODELS = {
    "qwen2-untied": lambda: _tiny("Qwen2", tie_word_embeddings=False),
    "qwen2-tied": lambda: _tiny("Qwen2", tie_word_embeddings=True),
    "llama": lambda: _tiny("Llama"),
    "gemma2-softcap": lambda: _tiny("Gemma2", head_dim=16, final_logit_softcapping=5.0),
    "phi-head-bias": lambda: _tiny("Phi"),  # lm_head has a bias
    "gpt2": _gpt2,
}


def _batch(vocab_size: int, seed: int = 0, left_padding: bool = True):
    """3 rows: prompts left-padded (0, 2, 1 pads), completions right-padded (7, 4, 6 tokens)."""
    generator = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(1, vocab_size, (3, 5), generator=generator)
    prompt_mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 1, 1, 1, 1]])
    if not left_padding:
        prompt_mask = torch.ones_like(prompt_mask)
    completion_ids = torch.randint(1, vocab_size, (3, 7), generator=generator)
    completion_mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 6 + [0]])
    return prompt_ids * prompt_mask, prompt_mask, completion_ids * completion_mask, completion_mask


def _reference(model, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """log_softmax of the model's own full logits, scored at the positions generation uses."""
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids(attention_mask)).logits  # [B, P + C, V]
    logits = logits[:, prompt_ids.size(1) - 1 : -1]  # [B, C, V]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / TEMPERATURE
    picked = torch.log_softmax(logits, -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    return picked * completion_mask


def _logps_and_grads(function, model, batch):
    dtype = next(model.parameters()).dtype
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    model.zero_grad(set_to_none=True)
    logps = function(model, *batch)
    (logps * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return logps.detach(), grads


def _assert_same(ours, theirs):
    assert_float64_equal(ours[0], theirs[0], "log-probs")
    assert ours[1].keys() == theirs[1].keys() and ours[1]
    for name in theirs[1]:
        assert_float64_equal(ours[1][name], theirs[1][name], name)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("chunk_size", [3, None])
def test_fused_head_equals_the_models_own_logits(name, chunk_size, monkeypatch):
    """Fused log-probs and every parameter's gradient equal log_softmax of the model's own logits,
    with chunks smaller than the sequence (3 tokens) and the default; soft-capping and a head bias
    are reproduced, tied embeddings get both gradients. Guards the fused path's arithmetic."""
    model = in_float64(MODELS[name]())
    called = []
    original = sequence_logps.fused_head_logps
    monkeypatch.setattr(sequence_logps, "fused_head_logps", lambda *a, **k: called.append(1) or original(*a, **k))
    # Gemma 2's eager attention takes its softmax in float32, where a float64 model's mask value
    # becomes -inf and a query row with nothing to attend to (a left pad) NaN: no left pads for it.
    batch = _batch(model.config.vocab_size, left_padding=not name.startswith("gemma2"))
    ours = _logps_and_grads(lambda m, *b: completion_logps(m, *b, TEMPERATURE, chunk_size=chunk_size), model, batch)
    assert called, "the fused path must have run"
    _assert_same(ours, _logps_and_grads(lambda m, *b: _reference(m, *b), model, batch))


def test_no_full_vocabulary_tensor_is_kept_for_backward():
    """Guards item 13: the old code kept [B, C + 1, V] logits (and float32 copies) for backward.
    Now no tensor saved for backward, other than the weights, is as large as one row's [C, V]."""
    model = _tiny("Qwen2", vocab_size=4096, tie_word_embeddings=True)
    batch = _batch(4096)
    parameters = {p.data_ptr() for p in model.parameters()}
    saved: list[tuple[int, tuple[int, ...]]] = []

    def pack(tensor):
        if tensor.data_ptr() not in parameters:
            saved.append((tensor.numel(), tuple(tensor.shape)))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logps = completion_logps(model, *batch, TEMPERATURE, chunk_size=4)
    logps.sum().backward()
    largest = max(saved)
    assert largest[0] < batch[2].size(1) * 4096, f"a {largest[1]} tensor is kept for backward"


@pytest.mark.parametrize("fused", [True, False])
def test_left_padding_does_not_change_log_probs(fused, monkeypatch):
    """Guards item 7: scored without position_ids, a left-padded row sat at other positions than
    generation gave it (generation counts from the first real token), so its log-probs changed
    with the padding that its batch-mates' longer prompts forced on it. GPT-2's learned absolute
    positions show it outright; rotary models (Qwen, Llama) see only a constant shift, to which
    attention is invariant up to rounding."""
    if not fused:
        monkeypatch.setattr(sequence_logps, "_fusable_head", lambda model: None)
    model = in_float64(_gpt2())
    prompt_ids, prompt_mask, completion_ids, completion_mask = _batch(300)
    row = 1  # two pads
    alone = completion_logps(model, prompt_ids[row:row + 1, 2:], prompt_mask[row:row + 1, 2:],
                             completion_ids[row:row + 1], completion_mask[row:row + 1], TEMPERATURE)
    padded = completion_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask, TEMPERATURE)
    assert alone.abs().sum() > 0
    assert_float64_equal(padded[row:row + 1], alone)


def test_padding_positions_score_zero_on_both_paths(monkeypatch):
    """Padding is 0 whichever path runs, so the fallback and the fused path are interchangeable."""
    model = in_float64(_tiny("Qwen2"))
    batch = _batch(300)
    with torch.no_grad():
        fused = completion_logps(model, *batch, TEMPERATURE)
        monkeypatch.setattr(sequence_logps, "_fusable_head", lambda model: None)
        plain = completion_logps(model, *batch, TEMPERATURE)
    assert (fused[batch[3] == 0] == 0).all() and (fused[batch[3] == 1] < 0).all()
    assert_float64_equal(fused, plain)


def test_lora_policy_is_fused_and_an_adapted_head_falls_back(caplog, monkeypatch):
    """LoRA on all linear layers leaves lm_head alone: fused, and the adapters get the reference's
    gradients. LoRA on lm_head itself cannot be fused: the plain path runs, says so once, and still
    matches the reference."""
    from rlcode.models.adapters import LoraSettings, apply_lora

    def lora(targets):
        model = apply_lora(in_float64(_tiny("Qwen2", tie_word_embeddings=False)),
                           LoraSettings(r=4, dropout=0.0, target_modules=targets),
                           quantized=False, gradient_checkpointing=False)
        for parameter_name, parameter in model.named_parameters():
            if "lora_B" in parameter_name:  # peft starts B at zero: make the adapters matter
                torch.nn.init.normal_(parameter, std=0.1, generator=torch.Generator().manual_seed(2))
        return model

    batch = _batch(300)
    monkeypatch.setattr(sequence_logps, "_reported", set())
    for targets, fused in (("all-linear", True), (["q_proj", "lm_head"], False)):
        model = lora(targets)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=sequence_logps.__name__):
            ours = _logps_and_grads(lambda m, *b: completion_logps(m, *b, TEMPERATURE, chunk_size=3), model, batch)
            completion_logps(model, *batch, TEMPERATURE)
            assert (sequence_logps._fusable_head(model) is not None) == fused
        warnings = [record.getMessage() for record in caplog.records]
        assert len(warnings) == (0 if fused else 1), warnings
        assert fused or "peft.tuners.lora" in warnings[0]
        assert all("lora" in name for name in ours[1])
        _assert_same(ours, _logps_and_grads(lambda m, *b: _reference(m, *b), model, batch))


def test_autocast_runs_the_head_in_the_autocast_dtype():
    """Under bf16 autocast (Lightning's bf16-mixed) the fused head rounds like the model's own
    bf16 lm_head: it matches the plain path under autocast far closer than the float32 result."""
    model = _tiny("Qwen2", vocab_size=2000)
    batch = _batch(2000)
    with torch.no_grad():
        exact = completion_logps(model, *batch, TEMPERATURE)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fused = completion_logps(model, *batch, TEMPERATURE, chunk_size=5)
            reference = _reference(model, *batch)
    assert fused.dtype == torch.float32
    # Not a tolerance but a choice between two outcomes: a head run in float32 would give fused ==
    # exact (ratio 1); one run in bf16 differs from the reference only by summation order in float32
    # accumulation (measured ratio 4e-4 on transformers 5.24). 0.1 sits orders of magnitude from both.
    assert (fused - reference).abs().max() < 0.1 * (exact - reference).abs().max()
