"""``rlcode export`` on checkpoints written by ``rlcode fit`` itself: every training mode, full
fine-tune, LoRA and QLoRA, with and without ``--merge``; and its errors on bad input.

Each case runs ``rlcode fit`` in this process (the tiny random model, one step), keeps the trained
module, exports the checkpoint the run wrote and loads the folder the way users do (transformers,
or peft for adapters). What the folder computes is compared with what the trained policy computes
in float64: a float64 *twin* of the trained policy (its weights upcast exactly; a 4-bit weight
dequantized, which is what its forward does) is the reference.
"""

from __future__ import annotations

import copy
import json
import os
import stat
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from rlcode.cli import command as cli
from rlcode.cli.export import build_mode, export
from rlcode.models import resolve_model_source

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"GRPO": "quickstart.yaml", "SPIRAL": "spiral_tictactoe.yaml", "MultiStepMBPP": "multistep_mbpp.yaml",
           "CodeGame": "code_game.yaml"}
ADAPTERS = {"full": [], "lora": ["--model.lora", "{r: 4, alpha: 8}"],
            "qlora": ["--model.lora", "{r: 4, alpha: 8}", "--model.quantization", "4bit"]}
CASES = [(mode, adapters) for mode in CONFIGS for adapters in ("full", "lora")]
CASES += [("GRPO", "qlora"), ("SPIRAL", "qlora")]
# float32 rounds to nearest: a float64 value x is stored within 2**-24 |x|. The merged weights are
# computed in float64 (error ~1e-16 relative, far below float32's) and rounded once.
ONE_ROUNDING = 2.0**-24 * (1 + 2.0**-20)


class NudgeTrainedWeights(Callback):
    """Moves every trainable weight off its starting value before the first step. A random model's
    rewards are often all equal (no gradient), and LoRA's B starts at zero: without this the
    checkpoint could hold the base model, and an export that ignored the checkpoint would pass."""

    def on_train_start(self, trainer, pl_module) -> None:
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in pl_module.policy.parameters():
                if param.requires_grad:
                    param.add_(0.05 * torch.randn(param.shape, generator=generator).to(param))


def fit(monkeypatch, root: Path, mode: str, adapters: str):
    """``rlcode fit`` of one step; returns (the trained module, the last.ckpt it wrote)."""
    built = {}
    instantiate_trainer = cli.RLCodeCLI.instantiate_trainer

    def keep_module_and_nudge(self, **kwargs):
        built["module"] = self.model
        trainer = instantiate_trainer(self, **kwargs)
        trainer.callbacks.insert(0, NudgeTrainedWeights())
        return trainer

    monkeypatch.setattr(cli.RLCodeCLI, "instantiate_trainer", keep_module_and_nudge)
    quiet = [f"--{key}.{when}" for key in ("eval", "game_eval") for when in ("at_start", "at_end")]
    cli.main(["fit", "--config", str(REPO / "configs" / CONFIGS[mode]),
              "--config", str(REPO / "configs/tiny_test.yaml"), "--run.root_dir", str(root),
              "--trainer.max_steps", "1", *ADAPTERS[adapters],
              *[item for flag in quiet for item in (flag, "false")]])
    module = built["module"]
    assert type(module.mode).__name__ == mode and module.global_step == 1
    return module, next(root.glob("tiny/version_*/checkpoints/last.ckpt"))


def float64_twin(policy):
    """A float64 copy of ``policy`` computing what it computes: 4-bit layers become float64 Linear
    layers of their dequantized weights (bitsandbytes' CPU forward dequantizes, then multiplies)."""
    import bitsandbytes as bnb

    twin = copy.deepcopy(policy)
    for layer in list(twin.modules()):
        for name, child in list(layer.named_children()):
            if not isinstance(child, bnb.nn.Linear4bit):  # (peft's LoRA wrapper of one is not one)
                continue
            weight = child.weight
            linear = torch.nn.Linear(child.in_features, child.out_features, bias=child.bias is not None)
            linear.weight = torch.nn.Parameter(bnb.functional.dequantize_4bit(weight.data, weight.quant_state))
            if child.bias is not None:
                linear.bias = torch.nn.Parameter(child.bias.detach().clone())
            setattr(layer, name, linear)
    return twin.double().eval()


def folded(twin):
    """The float64 twin with each adapter folded into its base weight by hand (W + scaling B A),
    as a plain model (peft's wrappers removed)."""
    from peft.tuners.lora import LoraLayer

    for layer in twin.modules():
        if isinstance(layer, LoraLayer):
            for adapter in layer.active_adapters:
                update = layer.lora_B[adapter].weight @ layer.lora_A[adapter].weight * layer.scaling[adapter]
                layer.get_base_layer().weight.data += update
    return twin.unload()


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def sample_ids(model) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("mode, adapters", CASES, ids=[f"{m}-{a}" for m, a in CASES])
def test_export_of_a_fit_checkpoint_computes_the_trained_policy(tmp_path, monkeypatch, mode, adapters):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    module, ckpt = fit(monkeypatch, tmp_path / "runs", mode, adapters)
    saved = torch.load(ckpt, map_location="cpu", weights_only=False)
    assert saved["hyper_parameters"]["mode"]["class_path"].endswith(f".{mode}")
    assert type(build_mode(saved)).__name__ == mode
    twin = float64_twin(module.policy)
    ids = sample_ids(twin)
    expected = logits(twin, ids)

    umask = os.umask(0o027)  # a group-readable user's: what a plain open()/mkdir() would give
    try:
        out = export(ckpt, tmp_path / "export")
    finally:
        os.umask(umask)
    assert (out / "tokenizer_config.json").is_file()
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in [out, *out.rglob("*")]}
    assert modes == {name: 0o750 if name == out.name else 0o640 for name in modes}, modes  # weights were 0600
    if adapters == "full":
        assert (out / "model.safetensors").is_file()
        loaded = AutoModelForCausalLM.from_pretrained(out)
        base = AutoModelForCausalLM.from_pretrained(resolve_model_source(module.hparams.model_name)).double()
        assert (expected - logits(base, ids)).abs().max() > 1e-2, "training must have moved the weights"
        torch.testing.assert_close(logits(loaded.double(), ids), expected)  # float64 tolerances
        return

    config = json.loads((out / "adapter_config.json").read_text())
    base_kwargs = {}
    if adapters == "qlora":  # the adapters were trained on the 4-bit base: load it the same way
        from rlcode.models.adapters import quantization_config

        base_kwargs = {"quantization_config": quantization_config("4bit", torch.float32), "device_map": {"": "cpu"}}
    # the short name others can resolve (tiny-random has no hub id), not this user's cache folder
    assert config["base_model_name_or_path"] == module.hparams.model_name
    base = AutoModelForCausalLM.from_pretrained(resolve_model_source(config["base_model_name_or_path"]), **base_kwargs)
    loaded = float64_twin(PeftModel.from_pretrained(base, out))
    with twin.disable_adapter():
        assert (expected - logits(twin, ids)).abs().max() > 1e-2, "the adapters must matter"
    torch.testing.assert_close(logits(loaded, ids), expected)

    merged_out = export(ckpt, tmp_path / "merged", merge=True)
    assert not (merged_out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_out)
    assert getattr(merged.config, "quantization_config", None) is None, "a merged QLoRA model is plain float32"
    assert all(p.dtype == torch.float32 for p in merged.parameters())
    reference = folded(twin)
    torch.testing.assert_close(logits(reference, ids), expected)  # folding is exact algebra: float64 agrees
    weights = dict(reference.named_parameters())
    for name, param in merged.named_parameters():
        want = weights[name]
        assert ((param.double() - want).abs() <= ONE_ROUNDING * want.abs()).all(), f"{name}: more than one rounding"
    # The folder computes the merged weights, as stored (float32), in float64.
    stored = copy.deepcopy(reference)
    for param in stored.parameters():
        param.data = param.data.float().double()
    torch.testing.assert_close(logits(merged.double(), ids), logits(stored, ids))


def test_a_module_saved_from_python_is_exported_as_its_own_mode():
    """A Learner saves its mode's class path and settings (``hyper_parameters["mode"]``, plain data), so a
    checkpoint of a module built in Python names its mode too, settings objects included."""
    from grpo_harness import learner
    from rlcode.modes import GRPO, SPIRAL, CodeGame, MultiStepMBPP
    from rlcode.rollout.openai.client import OpenAISettings
    from rlcode.training.run_context import SandboxSettings

    for mode in (GRPO, SPIRAL, MultiStepMBPP, CodeGame):
        server = OpenAISettings(base_url="http://127.0.0.1:9/v1", api="chat")
        extra = {"opponent": "served", "opponent_server": server} \
            if mode is CodeGame else {"sandbox": SandboxSettings(workers=3)} if mode is GRPO else {}
        saved = dict(learner(mode, model_name="tiny-random", **extra).hparams)
        torch.save(saved, "/dev/null")  # plain data a checkpoint can hold
        rebuilt = build_mode({"hyper_parameters": saved})
        assert type(rebuilt) is mode and rebuilt.init_args() == saved["mode"]["init_args"]
    assert rebuilt.opponent_server.base_url == "http://127.0.0.1:9/v1"  # a settings object again, not a dict


def _save(path: Path, payload) -> Path:
    torch.save(payload, path)
    return path


BAD_INPUT = {
    "missing": (lambda tmp: tmp / "nope.ckpt", "no checkpoint at"),
    "folder": (lambda tmp: tmp, "is a folder: pass the .ckpt file in it"),
    "not torch": (lambda tmp: (tmp / "x.ckpt").write_text("hello") and tmp / "x.ckpt",
                  "not a checkpoint torch can read"),
    "not a dict": (lambda tmp: _save(tmp / "x.ckpt", torch.zeros(3)), "not an rlcode training checkpoint"),
    "no settings": (lambda tmp: _save(tmp / "x.ckpt", {"state_dict": {}}), "not an rlcode training checkpoint"),
    "other module": (lambda tmp: _save(tmp / "x.ckpt", {"state_dict": {}, "hyper_parameters": {
        "mode": {"class_path": "lightning.pytorch.demos.boring_classes.BoringModel"}}}),
                     "not an rlcode training mode"),
    "unknown class": (lambda tmp: _save(tmp / "x.ckpt", {"state_dict": {}, "hyper_parameters": {
        "mode": {"class_path": "my_modes.Gone"}}}), "cannot be imported here"),
    "no mode": (lambda tmp: _save(tmp / "x.ckpt", {"state_dict": {}, "hyper_parameters": {
        "_class_path": "rlcode.algorithms.grpo.GRPO", "lr": 1.0}}), "names no training mode"),
    "other weights": (lambda tmp: _save(tmp / "x.ckpt", {"state_dict": {"policy.head.weight": torch.zeros(1)},
                                                          "hyper_parameters": {
        "mode": {"class_path": "rlcode.modes.GRPO", "init_args": {}}, "model_name": "tiny-random"}}),
                      "does not fit GRPO('tiny-random') with full weights"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_a_one_line_error(tmp_path, case):
    make, message = BAD_INPUT[case]
    with pytest.raises(SystemExit) as error:
        cli.main(["export", "--ckpt", str(make(tmp_path)), "--out", str(tmp_path / "out")])
    text = str(error.value.code)
    assert message in text and text.startswith("rlcode export: ") and "\n" not in text, text
    assert not (tmp_path / "out").exists(), "nothing is written"


def test_adapters_of_a_short_name_record_its_public_hub_id():
    """Not the folder in the exporting user's cache (~/.cache/rlcode/models/...)."""
    from types import SimpleNamespace

    from rlcode.cli.export import name_base_model

    policy = SimpleNamespace(peft_config={"default": SimpleNamespace(base_model_name_or_path="~/.cache/rlcode/models/x")})
    name_base_model(policy, "smollm2-135m-instruct")
    assert policy.peft_config["default"].base_model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    name_base_model(policy, "some/other-model")  # a hub id or a folder the user gave: kept as given
    assert policy.peft_config["default"].base_model_name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_a_folder_in_use_is_not_written_into(tmp_path):
    """Files of an earlier export would mix with the new one's (an adapter_config.json beside merged
    weights makes transformers load the adapter)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "adapter_config.json").write_text("{}")
    with pytest.raises(SystemExit, match="exists and is not an empty folder"):
        cli.main(["export", "--ckpt", str(tmp_path / "any.ckpt"), "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["adapter_config.json"]
