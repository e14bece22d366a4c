"""Weights streamed into vLLM: checkpoint names for plain, checkpoint-wrapped and peft models, LoRA
merged out of place (the base stays bit-identical), one tensor at a time."""

from __future__ import annotations

import pytest
import torch

import vllm_stand_in
from exact_float64 import assert_float64_equal, in_float64
from rlcode.models import LoraSettings, load_model, load_tokenizer, resolve_model_source
from rlcode.models.plain_weights import adapters_disabled, peft_checkpoint_name
from rlcode.rollout.vllm.weights import check_servable, streamed_weights


def plain_names() -> list[str]:
    return [name for name, _ in load_model("tiny-random").named_parameters()]


def lora_policy(precision: str = "32-true", **extra):
    policy = load_model("tiny-random", precision=precision, lora=LoraSettings(r=4, dropout=0.0, extra=extra)).eval()
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: a non-zero B makes the merge visible
                parameter.copy_(torch.randn(parameter.shape, generator=torch.Generator().manual_seed(len(name))) * 0.05)
    return policy


def test_plain_model_streams_its_own_parameters_under_checkpoint_names():
    model = load_model("tiny-random")
    streamed = list(streamed_weights(model))
    assert [name for name, _ in streamed] == plain_names()
    for (_, tensor), parameter in zip(streamed, model.parameters()):
        assert tensor.data_ptr() == parameter.data_ptr()  # no copy of an unmerged weight
    # Tied embeddings come once, as named_parameters gives them (vLLM ties lm_head itself).
    assert "lm_head.weight" not in dict(streamed)


def test_checkpoint_wrapped_layers_stream_under_plain_names():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )

    model = load_model("tiny-random")
    apply_activation_checkpointing(model, check_fn=lambda module: type(module).__name__.endswith("DecoderLayer"))
    wrapped = [name for name, _ in model.named_parameters()]
    assert any("_checkpoint_wrapped_module" in name for name in wrapped)
    assert [name for name, _ in streamed_weights(model)] == plain_names()


def vllm_engine_model():
    """The stand-in engine's model for the tiny checkpoint: vLLM 0.33's weight-name rules (tied lm_head alias)."""
    return vllm_stand_in.EngineModel([], resolve_model_source("tiny-random"))


def train_embedding_copy(policy) -> None:
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "modules_to_save" in name:
                parameter.add_(0.5)  # the trained copy now differs from the frozen original


def test_a_head_trained_apart_from_its_tied_embedding_is_refused_before_the_first_push():
    """vLLM 0.33 skips lm_head.weight as an alias of the tied embedding and raises when the embedding
    is not in the same call: peft's modules_to_save=["lm_head"] on a tied model cannot be served."""
    policy = lora_policy(modules_to_save=["lm_head"])
    trained_head = policy.base_model.model.lm_head.modules_to_save["default"].weight
    with pytest.raises(ValueError, match="tied weight is uninitialized"):  # what the engine would do
        vllm_engine_model().load_weights([("lm_head.weight", trained_head.detach())])
    with pytest.raises(NotImplementedError, match="ensure_weight_tying: true"):
        check_servable(policy)
    with pytest.raises(NotImplementedError, match="ensure_weight_tying: true"):
        next(iter(streamed_weights(policy)))


def test_a_tied_trained_embedding_streams_once_and_the_engine_loads_it():
    policy = lora_policy(modules_to_save=["lm_head"], ensure_weight_tying=True)  # peft: one tied trained copy
    train_embedding_copy(policy)
    check_servable(policy)
    streamed = list(streamed_weights(policy))
    assert [name for name, _ in streamed] == plain_names()  # lm_head comes as model.embed_tokens.weight
    engine = vllm_engine_model()
    for name, tensor in streamed:
        engine.load_weights([(name, tensor)])  # one tensor per call, as the backend pushes
    trained = policy.base_model.model.model.embed_tokens.modules_to_save["default"].weight
    assert torch.equal(engine.weights["model.embed_tokens.weight"], trained)
    assert torch.equal(policy.base_model.model.lm_head.weight, trained)  # and it is the head peft computes with


def test_lora_streams_merged_weights_under_plain_names_and_modules_to_save_replaces_the_original():
    policy = lora_policy(modules_to_save=["model.norm"])
    train_embedding_copy(policy)
    names = [name for name, _ in streamed_weights(policy)]
    assert names == plain_names()
    for fragment in ("lora_", "base_layer", "base_model", "modules_to_save", "original_module"):
        assert not any(fragment in name for name in names), fragment
    trained_norm = policy.base_model.model.model.norm.modules_to_save["default"].weight
    assert torch.equal(dict(streamed_weights(policy))["model.norm.weight"], trained_norm)


def test_with_adapters_switched_off_the_stream_is_the_base():
    """Inside disable_adapter() the module computes the starting policy; so does what is streamed."""
    policy = lora_policy(modules_to_save=["model.norm"])
    train_embedding_copy(policy)
    base = dict(load_model("tiny-random").named_parameters())
    with policy.disable_adapter():
        assert adapters_disabled(policy)
        streamed = list(streamed_weights(policy))
    assert [name for name, _ in streamed] == list(base)
    for name, tensor in streamed:
        assert torch.equal(tensor, base[name]), name
    assert not adapters_disabled(policy)
    differing = [name for name, tensor in streamed_weights(policy) if not torch.equal(tensor, base[name])]
    assert len(differing) >= 14  # adapted projections and the trained norm: the test can tell the two apart


@pytest.mark.parametrize("name, expected", [
    ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
    ("base_model.model.model.embed_tokens.lora_embedding_A.default", None),
    ("base_model.model.lm_head.original_module.weight", None),
    ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
    ("base_model.model.lm_head.modules_to_save.other.weight", None),  # an inactive adapter's copy
    ("base_model.model.model.norm.original_module.weight", None),
    ("base_model.model.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.base_layer.weight",
     "model.layers.0.mlp.up_proj.weight"),
    ("base_model.model.model.norm.weight", "model.norm.weight"),
])
def test_peft_name_mapping(name, expected):
    assert peft_checkpoint_name(name, ["default"]) == expected


@pytest.mark.parametrize("name, expected", [
    ("base_model.model.model.norm.original_module.weight", "model.norm.weight"),
    ("base_model.model.model.norm.modules_to_save.default.weight", None),
    ("base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight", "model.layers.0.self_attn.q_proj.weight"),
])
def test_peft_name_mapping_with_adapters_switched_off(name, expected):
    assert peft_checkpoint_name(name, ["default"], disabled=True) == expected


def test_merged_weights_give_the_lora_policy_in_a_plain_model():
    """In float64, where merged and unmerged adapters agree to rounding (``exact_float64``)."""
    policy = in_float64(lora_policy("64-true"))
    plain = in_float64(load_model("tiny-random", precision="64-true").eval())
    with torch.no_grad():
        for name, tensor in streamed_weights(policy):
            plain.get_parameter(name).copy_(tensor)
    inputs = load_tokenizer("tiny-random")(["def add(a, b):"], return_tensors="pt")
    with torch.no_grad():
        merged_logits, policy_logits = plain(**inputs).logits, policy(**inputs).logits
        assert_float64_equal(merged_logits, policy_logits, "logits")
        with policy.disable_adapter():  # the merge is visible: the adapters change the output
            assert float((merged_logits - policy(**inputs).logits).abs().max()) > 1e-3  # rounding: ~1e-15
    assert not any(getattr(module, "merged", False) for module in policy.modules())


def test_out_of_place_merge_leaves_a_bf16_base_bit_identical():
    policy = lora_policy("bf16-true")
    frozen = {name: parameter.detach().clone() for name, parameter in policy.named_parameters()
              if not parameter.requires_grad}
    for _ in range(3):  # three syncs
        for _ in streamed_weights(policy):
            pass
    for name, parameter in policy.named_parameters():
        if name in frozen:
            assert torch.equal(parameter, frozen[name]), name
    # What the test guards against: peft's in-place merge + unmerge in bf16 does not give the base back.
    policy.merge_adapter()
    policy.unmerge_adapter()
    assert any(not torch.equal(parameter, frozen[name]) for name, parameter in policy.named_parameters()
               if name in frozen)


def test_one_merged_tensor_at_a_time(monkeypatch):
    import rlcode.models.plain_weights as plain_weights

    policy = lora_policy()
    merges = []
    original = plain_weights.lora_delta
    monkeypatch.setattr(plain_weights, "lora_delta", lambda *args: merges.append(1) or original(*args))
    for name, _ in streamed_weights(policy):
        if "q_proj" in name:  # the first LoRA-adapted weight
            break
    assert len(merges) == 1  # nothing merged ahead of what was consumed


def test_lora_variants_are_refused_with_the_fix():
    policy = load_model("tiny-random", lora=LoraSettings(r=4, dropout=0.0, extra={"use_dora": True}))
    with pytest.raises(NotImplementedError, match="DoRA"):
        next(iter(streamed_weights(policy)))
