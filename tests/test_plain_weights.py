"""``plain_weights``: the policy's weights as a model without peft holds them, equal to peft's own
``merge_and_unload`` for a full model, LoRA (linear layers and the embedding, ``modules_to_save``) and
QLoRA (a 4-bit base, compared with the same merge of its dequantized weights), and gathered one tensor
at a time from a sharded (FSDP2) policy.

Equal means ``torch.equal``: the reference and ``plain_weights`` do the same arithmetic (B @ A, times
the scaling, added to the base) on the same values, in float64 when asked and in the weights' own
dtype by default, so no tolerance is due.
"""

from __future__ import annotations

import copy

import pytest
import torch

import rlcode.models.plain_weights as plain_weights_module
from rlcode.models import LoraSettings, load_model
from rlcode.models.plain_weights import plain_weights

# Not 8 / 4 = 2, a power of two: a scaling that rounds makes a merge done in another order show.
LORA = {"r": 4, "alpha": 7, "dropout": 0.0}
WITH_EMBEDDING = {"target_modules": ["q_proj", "down_proj", "embed_tokens"],
                  "extra": {"modules_to_save": ["model.norm"]}}


def trained(policy):
    """LoRA's B starts at zero and a modules_to_save copy at the original: move both, so the merge shows."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name or "lora_embedding_B" in name or "modules_to_save" in name:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator).to(parameter))
    return policy.eval()


def lora_policy(precision: str = "32-true", quantization: str | None = None, **settings):
    return trained(load_model("tiny-random", precision=precision, quantization=quantization,
                              lora=LoraSettings(**{**LORA, **settings})))


def assert_equal_weights(plain: dict[str, torch.Tensor], reference) -> None:
    expected = dict(reference.named_parameters())
    assert list(plain) == list(expected)
    for name, tensor in plain.items():
        assert tensor.dtype == expected[name].dtype, name
        assert torch.equal(tensor, expected[name]), name


def test_a_full_model_yields_its_own_parameters():
    model = load_model("tiny-random")
    assert_equal_weights(dict(plain_weights(model, dtype=torch.float64)), copy.deepcopy(model).double())
    for (_, tensor), parameter in zip(plain_weights(model), model.parameters()):
        assert tensor.data_ptr() == parameter.data_ptr()  # its own dtype: the parameter, not a copy


@pytest.mark.parametrize("settings", [{}, WITH_EMBEDDING], ids=["all-linear", "embedding-and-modules-to-save"])
def test_lora_equals_peft_merge_and_unload_in_float64(settings):
    policy = lora_policy(**settings)
    reference = copy.deepcopy(policy).double().merge_and_unload()
    assert_equal_weights(dict(plain_weights(policy, dtype=torch.float64)), reference)


def test_lora_in_its_own_dtype_equals_peft_merge_and_unload_there():
    policy = lora_policy()
    assert_equal_weights(dict(plain_weights(policy)), copy.deepcopy(policy).merge_and_unload())


def test_the_policy_is_left_as_it_was():
    policy = lora_policy("bf16-true", **WITH_EMBEDDING)
    before = {name: parameter.detach().clone() for name, parameter in policy.named_parameters()}
    for _ in plain_weights(policy, dtype=torch.float64):
        pass
    assert all(torch.equal(parameter, before[name]) and parameter.dtype == before[name].dtype
               for name, parameter in policy.named_parameters())
    assert not any(getattr(module, "merged", False) for module in policy.modules())


def test_qlora_equals_peft_merge_and_unload_of_the_dequantized_base_in_float64():
    """peft's merge_and_unload of a 4-bit model quantizes the merged weight again; the reference here is
    the same LoRA model with the base's dequantized weights (exact in float64), merged by peft."""
    import bitsandbytes as bnb

    policy = lora_policy(quantization="4bit")
    reference = load_model("tiny-random", precision="64-true", lora=LoraSettings(**LORA))
    quantized = dict(policy.named_parameters())
    assert any(type(parameter).__name__ == "Params4bit" for parameter in quantized.values())
    with torch.no_grad():
        for name, parameter in reference.named_parameters():
            source = quantized[name]
            if type(source).__name__ == "Params4bit":
                source = bnb.functional.dequantize_4bit(source.data, source.quant_state)
            parameter.copy_(source)
    assert_equal_weights(dict(plain_weights(policy, dtype=torch.float64)), reference.merge_and_unload())


def test_lora_variants_are_refused():
    policy = load_model("tiny-random", lora=LoraSettings(r=4, dropout=0.0, extra={"use_dora": True}))
    with pytest.raises(NotImplementedError, match="DoRA"):
        next(plain_weights(policy))


@pytest.fixture
def one_rank_mesh():
    """A one-process gloo group: FSDP2 shards over it as over many (DTensor parameters, gathered by a
    collective), without starting processes; the two-rank gather is ``tests/test_fsdp_weights.py``'s."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_sharded_policy_is_gathered_one_tensor_at_a_time(one_rank_mesh, monkeypatch, lora):
    from torch.distributed.tensor import DTensor

    from rlcode.models.sharding import ShardingPlan, shard_model

    whole = lora_policy() if lora else load_model("tiny-random")
    sharded = shard_model(copy.deepcopy(whole), ShardingPlan(one_rank_mesh))
    assert all(isinstance(parameter, DTensor) for parameter in sharded.parameters())
    gathers = []
    full_tensor = DTensor.full_tensor
    monkeypatch.setattr(DTensor, "full_tensor", lambda self, **kwargs: gathers.append(1) or full_tensor(self, **kwargs))
    merges = []
    lora_delta = plain_weights_module.lora_delta
    monkeypatch.setattr(plain_weights_module, "lora_delta", lambda *args: merges.append(1) or lora_delta(*args))
    stream, plain = plain_weights(sharded, dtype=torch.float64), {}
    for name, tensor in stream:
        plain[name] = tensor
        # nothing gathered ahead of what was consumed: the weight, and for a merged one its two factors
        assert len(gathers) == len(plain) + 2 * len(merges), name
    assert not any(isinstance(tensor, DTensor) for tensor in plain.values())
    assert (len(merges) > 0) == lora
    expected = dict(plain_weights(whole, dtype=torch.float64))
    assert list(plain) == list(expected)
    assert all(torch.equal(plain[name], expected[name]) for name in expected)
