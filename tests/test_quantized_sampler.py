"""The int8 sampler (``model.rollout_precision: int8``) on the tiny random model: the HF backend's decode
loop and KV cache give a reference int8 model's greedy tokens, the copy follows weight updates, LoRA is
merged into it, its log-probs are kept and weight the loss, a layer torch cannot pack stays fp32 with one
log line, and a GPU is refused in one line."""

import copy
import logging

import pytest
import torch
from torch import nn
from transformers import DynamicCache

import rlcode.rollout.quantized_sampler as quantized_sampler
import rlcode.training.policy_update as policy_update
from rlcode.models import load_model, load_tokenizer
from rlcode.models.adapters import LoraSettings
from rlcode.models.cache_name import cache_argument
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt
from rlcode.rollout.quantized_sampler import (FP32_LAYERS, QuantizedSampler, device_refusal, precision_refusal,
                                              int8_linear_class, quantized_copy)

TEXTS = ["def add(a, b):", "Write a function that returns the sum of a list of numbers.", "class Stack:"]
INT8 = torch.ao.nn.quantized.dynamic.Linear


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


@pytest.fixture
def model():
    return load_model("tiny-random").eval()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [render_prompt(tokenizer, text, chat=True) for text in TEXTS]


def reference_int8(model):
    """torch's own ``quantize_dynamic`` of a full copy, with the sampler's layer choice and activation range."""
    spec = {name: torch.ao.quantization.per_channel_dynamic_qconfig for name, module in model.named_modules()
            if isinstance(module, nn.Linear) and name.split(".")[-1] not in FP32_LAYERS}
    return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), spec, dtype=torch.qint8,
                                                  mapping={nn.Linear: int8_linear_class()}).eval()


@torch.no_grad()
def reference_greedy(model, tokenizer, prompt: str, steps: int) -> list[int]:
    """Plain HF forward passes with a cache, one token at a time (dynamic quantization scales each call's
    activations, so the reference feeds the layers what the decode loop feeds them)."""
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    cache, keyword = DynamicCache(), cache_argument(model)
    logits = model(input_ids=ids, use_cache=True, logits_to_keep=1, **{keyword: cache}).logits[:, -1]
    tokens = []
    for _ in range(steps):
        token = int(logits.argmax(-1))
        tokens.append(token)
        logits = model(input_ids=torch.tensor([[token]]), use_cache=True, **{keyword: cache}).logits[:, -1]
    return tokens


def head_logits(model, ids=torch.arange(3, 20).unsqueeze(0)):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_every_linear_but_the_down_projections_is_int8(model):
    copy_, fallbacks = quantized_copy(model)
    kinds = {name.split(".")[-1]: type(module) for name, module in copy_.named_modules()
             if isinstance(module, (nn.Linear, INT8))}
    assert fallbacks == [] and kinds.pop("down_proj") is nn.Linear
    assert set(kinds.values()) == {int8_linear_class()} and "lm_head" in kinds
    # embeddings and norms are the policy's own tensors, not copies
    shared = {name: p.data_ptr() for name, p in model.named_parameters()}
    assert all(shared[name] == p.data_ptr() for name, p in copy_.named_parameters())


def test_greedy_tokens_equal_a_reference_int8_model(model, tokenizer, prompts):
    backend = HFGenerateBackend(model, tokenizer, rollout_precision="int8", eos_token_ids=[0])  # no early stop
    reference = reference_int8(model)
    for prompt in prompts:  # one prompt per call: activation scales are per batch
        rollout = backend.generate([prompt], 1, SamplingParams(temperature=0, max_new_tokens=12))
        assert rollout.completion_ids[0].tolist() == reference_greedy(reference, tokenizer, prompt, 12)
    # and the int8 sampler is not the fp32 policy (else the test would prove nothing)
    assert not torch.equal(head_logits(reference), head_logits(model))


def test_sampling_logps_are_the_int8_models_log_softmax_of_the_sampled_tokens(model, tokenizer, prompts):
    backend = HFGenerateBackend(model, tokenizer, rollout_precision="int8", eos_token_ids=[0])
    temperature, steps = 0.7, 8
    rollout = backend.generate(prompts[:1], 2, SamplingParams(temperature=temperature, max_new_tokens=steps, seed=3))
    assert rollout.completion_mask.all()  # no row ended early: the batch kept its shape
    # Replay the sampled tokens through the reference as the loop ran them: the prompt once, its cache
    # copied for both rows, then one step per token for both rows together (the same activation scales).
    reference, tokens = reference_int8(model), rollout.completion_ids
    keyword = cache_argument(reference)
    with torch.no_grad():
        ids = rollout.prompt_ids[:1]
        cache = DynamicCache()
        logits = [reference(input_ids=ids, use_cache=True, logits_to_keep=1, **{keyword: cache}).logits[:, -1]
                  .repeat_interleave(2, dim=0)]
        cache.batch_repeat_interleave(2)
        for step in range(steps - 1):
            position = torch.full((2, 1), ids.shape[1] + step)
            logits.append(reference(input_ids=tokens[:, step:step + 1], position_ids=position, use_cache=True,
                                    **{keyword: cache}).logits[:, -1])
    expected = (torch.stack(logits, 1) / temperature).log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(rollout.sampling_logps, expected, atol=1e-5, rtol=0)
    assert HFGenerateBackend(model, tokenizer).generate(prompts[:1], 1, SamplingParams(max_new_tokens=4)) \
        .sampling_logps is None  # the policy samples itself: nothing to correct


def test_the_copy_is_rebuilt_after_a_weight_change_and_only_then(model, tokenizer, prompts):
    backend = HFGenerateBackend(model, tokenizer, rollout_precision="int8")
    params = SamplingParams(temperature=0, max_new_tokens=2)
    backend.generate(prompts[:1], 1, params)
    first = backend._quantized.model()
    assert backend.take_refresh_seconds() > 0 and backend.take_refresh_seconds() is None
    backend.generate(prompts[:1], 1, params)
    assert backend._quantized.model() is first and backend.take_refresh_seconds() is None
    before = head_logits(first)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model.train()
    model(input_ids=torch.arange(3, 20).unsqueeze(0)).logits.logsumexp(-1).sum().backward()
    optimizer.step()
    backend.weights_changed()
    backend.generate(prompts[:1], 1, params)
    refreshed = backend._quantized.model()
    assert refreshed is not first and backend.take_refresh_seconds() > 0
    assert not torch.equal(head_logits(refreshed), before)
    assert torch.equal(head_logits(refreshed), head_logits(reference_int8(model.eval())))


def test_lora_adapters_are_merged_into_the_copy(tokenizer):
    policy = load_model("tiny-random", lora=LoraSettings(r=4, alpha=8, dropout=0.0)).eval()
    for name, parameter in policy.named_parameters():
        if "lora_B" in name:  # adapters start at zero: give them a delta to merge
            torch.nn.init.normal_(parameter, std=0.5)
    merged = copy.deepcopy(policy).merge_and_unload()
    sampler = QuantizedSampler(policy)
    assert torch.equal(head_logits(sampler.model()), head_logits(reference_int8(merged)))
    with policy.disable_adapter():  # the SPIRAL opponent's base: adapters off, nothing merged
        base = quantized_copy(policy)[0]
    assert torch.equal(head_logits(base), head_logits(reference_int8(copy.deepcopy(policy).unload())))
    assert not torch.equal(head_logits(base), head_logits(sampler.model()))


def test_a_layer_torch_cannot_quantize_stays_fp32_with_one_log_line(model, monkeypatch, caplog):
    pack = quantized_sampler.int8_linear

    refused = model.model.layers[0].self_attn.q_proj.weight.data_ptr()  # the copy's linear shares it

    def refuse_q_proj(module):
        if module.weight.data_ptr() == refused:
            raise RuntimeError("no packing for this one")
        return pack(module)
    monkeypatch.setattr(quantized_sampler, "int8_linear", refuse_q_proj)
    sampler = QuantizedSampler(model)
    with caplog.at_level(logging.WARNING, logger=quantized_sampler.__name__):
        copy_ = sampler.model()
        sampler.weights_changed()
        sampler.model()  # a rebuild does not log again
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "could not be quantized" in lines[0] and "q_proj: RuntimeError" in lines[0]
    assert type(copy_.model.layers[0].self_attn.q_proj) is nn.Linear
    assert isinstance(copy_.model.layers[0].self_attn.o_proj, INT8)


def test_gpu_and_unsupported_settings_are_refused_in_one_line(model, monkeypatch):
    line = device_refusal(torch.device("cuda", 0))
    assert "\n" not in line and "rollout_precision same" in line
    assert device_refusal(torch.device("cpu")) is None
    # the policy on a stand-in GPU: refused before anything is built
    monkeypatch.setattr(quantized_sampler, "policy_device", lambda policy: torch.device("cuda", 0))
    with pytest.raises(ValueError, match="runs on CPU only.*use model.rollout_precision same"):
        quantized_copy(model)
    assert "rollout_backend 'vllm'" in precision_refusal("int8", "vllm", None)
    assert "8bit" in precision_refusal("int8", "hf", "8bit") and precision_refusal("int8", "hf", "4bit") is None
    assert precision_refusal("same", "vllm", "4bit") is None


def test_a_training_step_weights_the_loss_with_the_int8_samplers_logps(monkeypatch):
    from grpo_harness import build_module, fit_steps

    module = build_module(rollout_precision="int8", max_new_tokens=4)
    del module.generate  # real generation, through the int8 sampler
    seen = []
    weights = policy_update.truncated_importance_weights

    def recording(trainer_logps, sampler_logps, mask, cap):
        seen.append((sampler_logps.clone(), cap))
        return weights(trainer_logps, sampler_logps, mask, cap)
    monkeypatch.setattr(policy_update, "truncated_importance_weights", recording)
    generated = []
    backend_generate = module.backend.generate
    module.backend.generate = lambda *args, **kwargs: generated.append(backend_generate(*args, **kwargs)) \
        or generated[-1]
    fit_steps(module, steps=2)
    assert len(seen) == 2 and all(cap == 3.0 for _, cap in seen)
    for (sampler_logps, _), rollout in zip(seen, generated):
        torch.testing.assert_close(sampler_logps, rollout.sampling_logps, rtol=0, atol=0)
    step = module.last_step
    assert {"importance_log_ratio_abs_mean", "importance_log_ratio_abs_max",
            "importance_weight_capped_frac"} <= set(step.loss)
    assert step.timings["sampler_refresh"] > 0  # rebuilt after the first step's update


def test_evals_sample_in_full_precision_by_default_and_record_the_precision(monkeypatch):
    from types import SimpleNamespace

    import rlcode.eval.policy_scoring as policy_scoring

    asked = []

    def generate(prompts, per_prompt, **kwargs):
        asked.append(kwargs["precision"])
        return SimpleNamespace(completion_texts=["x"] * len(prompts) * per_prompt)
    monkeypatch.setattr(policy_scoring, "_check_all", lambda pool, problems, completions, per_task, timeout:
                        [SimpleNamespace(all_passed=True, passed=[True])] * len(completions))
    module, problems = SimpleNamespace(generate=generate), [policy_scoring.BatchProblem(1, ["assert True"])]
    report = policy_scoring.score_policy(module, ["p"], problems, None, step=0, split="x", max_new_tokens=4,
                                         timeout=1.0, batch_size=1)
    assert asked == ["same"] and report.as_json()["rollout_precision"] == "same"
    report = policy_scoring.score_policy(module, ["p"], problems, None, step=0, split="x", max_new_tokens=4,
                                         timeout=1.0, batch_size=1, num_samples=2, ks=[1], rollout_precision="int8")
    assert asked[1:] == ["int8", "int8"] and report.as_json()["rollout_precision"] == "int8"


def test_the_frozen_opponent_samples_at_the_trainers_precision(model, tokenizer, prompts):
    from types import SimpleNamespace

    from rlcode.training.frozen_policy import frozen_copy, frozen_generator

    params = SamplingParams(temperature=1.0, max_new_tokens=3)
    module = SimpleNamespace(policy=model, tokenizer=tokenizer, device=torch.device("cpu"), sharding_plan=None,
                             hparams={"rollout_precision": "int8"}, sampling_params=lambda seed: params,
                             stop_token=None)
    rollout = frozen_generator(module, frozen_copy(model))(prompts[:1], 0)
    assert rollout.sampling_logps is not None  # sampled by an int8 copy of the frozen weights
    module.hparams = {"rollout_precision": "same"}
    assert frozen_generator(module, frozen_copy(model))(prompts[:1], 0).sampling_logps is None


def test_activations_keep_8_bits_only_where_vnni_cannot_saturate(model, monkeypatch):
    linear = nn.Linear(64, 32)
    inputs = torch.randn(4, 64)
    inputs[:, 3] = 50.0  # an outlier channel: one per-tensor scale for all
    linear.qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    errors = {cls: float((cls.from_float(linear)(inputs) - linear(inputs)).abs().max())
              for cls in (quantized_sampler.FullRangeInt8Linear, INT8)}
    assert errors[quantized_sampler.FullRangeInt8Linear] < errors[INT8]
    monkeypatch.setattr(quantized_sampler, "_has_vnni", lambda: False)
    assert {type(m) for m in quantized_copy(model)[0].modules() if isinstance(m, INT8)} == {INT8}


def test_qlora_the_copy_is_the_dequantized_base_plus_the_adapters():
    policy = load_model("tiny-random", quantization="4bit", lora=LoraSettings(r=4, alpha=8, dropout=0.0)).eval()
    for name, parameter in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.5)
    every_linear = tuple({name.split(".")[-1] for name, m in policy.named_modules() if "proj" in name} | {"lm_head"})
    dense, _ = quantized_copy(policy, fp32_layers=every_linear)  # nothing int8: the dense copy alone
    torch.testing.assert_close(head_logits(dense), head_logits(policy), atol=1e-4, rtol=1e-4)
    with policy.disable_adapter():
        torch.testing.assert_close(head_logits(quantized_copy(policy, fp32_layers=every_linear)[0]),
                                   head_logits(policy), atol=1e-4, rtol=1e-4)
    assert any(isinstance(m, INT8) for m in quantized_copy(policy)[0].modules())
