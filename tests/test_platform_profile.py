"""The GPU profile: its values per kind (made-up hardware), the keys it leaves alone, the line it prints,
its switch, and its agreement with the explicit configs/hw overlays."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import rlcode.platform
from rlcode.cli import command as cli
from rlcode.platform import PlatformInfo, profile_for, profile_kind

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "grpo_code_execution.yaml"
GIB = 2**30


def gpu(name: str, capability: tuple[int, int], memory_gib: float) -> PlatformInfo:
    return PlatformInfo(device_type="cuda", gpu_name=name, gpu_count=1, compute_capability=capability,
                        gpu_memory_bytes=int(memory_gib * GIB), cpu_count=8)


# Memory as torch reports it (total_memory): a "16 GB" V100 shows 15.8 GiB, an "80 GB" H100 79.1 GiB.
V100_16 = gpu("Tesla V100-SXM2-16GB", (7, 0), 15.8)
V100_32 = gpu("Tesla V100-SXM2-32GB", (7, 0), 31.7)
A100_40 = gpu("NVIDIA A100-SXM4-40GB", (8, 0), 39.4)
A100_80 = gpu("NVIDIA A100-SXM4-80GB", (8, 0), 79.2)
H100 = gpu("NVIDIA H100 80GB HBM3", (9, 0), 79.1)

V100_VALUES = {"model.micro_batch_size": 2, "model.gradient_checkpointing": True,
               "model.vllm.gpu_memory_utilization": 0.25, "eval.batch_size": 8, "eval.num_questions": 10}
A100_VALUES = {"model.micro_batch_size": 4, "model.gradient_checkpointing": True,
               "model.vllm.gpu_memory_utilization": 0.25, "eval.batch_size": 16, "eval.num_questions": 20}
H100_VALUES = {"model.micro_batch_size": 8, "model.gradient_checkpointing": False,
               "model.vllm.gpu_memory_utilization": 0.3, "eval.batch_size": 32, "eval.num_questions": 20}
# Keys the hw overlays leave to the recipe: an overlay goes after a recipe, and a recipe's eval set is
# part of its experiment; the profile only fills it where no config sets it.
PROFILE_ONLY_KEYS = ("eval.num_questions",)


@pytest.mark.parametrize("info, kind, values", [
    (V100_16, "v100", V100_VALUES), (V100_32, "v100", V100_VALUES),
    (A100_40, "a100", A100_VALUES), (A100_80, "a100", A100_VALUES), (H100, "h100", H100_VALUES),
    # the generic rule: compute capability and memory, whatever the name
    (gpu("Tesla T4", (7, 5), 14.6), "v100", V100_VALUES),           # before sm_80
    (gpu("NVIDIA GeForce RTX 4090", (8, 9), 23.6), "v100", V100_VALUES),  # sm_89, but under 30 GiB
    (gpu("NVIDIA L40S", (8, 9), 44.4), "a100", A100_VALUES),
    (gpu("NVIDIA H100 MIG 3g.40gb", (9, 0), 39.4), "a100", A100_VALUES),  # sm_90 with 40 GB: A100-class
    (gpu("NVIDIA H200", (9, 0), 139.8), "h100", H100_VALUES),
    (gpu("NVIDIA B200", (10, 0), 178.4), "h100", H100_VALUES),
])
def test_profile_per_gpu_kind(info, kind, values):
    assert profile_kind(info) == kind
    assert profile_for(info) == values


def test_cpu_has_no_profile():
    assert profile_kind(PlatformInfo(cpu_count=2)) is None and profile_for(PlatformInfo(cpu_count=2)) == {}


def test_profile_for_returns_a_copy():
    profile_for(V100_16)["model.micro_batch_size"] = 99
    assert profile_for(V100_16)["model.micro_batch_size"] == 2


def _flatten(section: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in section.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


@pytest.mark.parametrize("overlay, gpus", [("v100", [V100_16, V100_32]), ("a100", [A100_40, A100_80]),
                                           ("h100", [H100])])
def test_hw_overlays_hold_the_profiles_values(overlay, gpus):
    """Each overlay holds its kind's profile, except the keys an overlay leaves to the recipe."""
    overlay_values = _flatten(yaml.safe_load((REPO / "configs" / "hw" / f"{overlay}.yaml").read_text()))
    for info in gpus:
        profile = profile_for(info)
        assert {key: profile[key] for key in profile if key not in PROFILE_ONLY_KEYS} == overlay_values, info


# ---- through the CLI, with detection faked ---------------------------------------------------------------

def _fake_gpu(monkeypatch, info: PlatformInfo) -> None:
    monkeypatch.setattr(rlcode.platform, "detect_platform", lambda: info)


def _print_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None)
    merged = yaml.safe_load(capsys.readouterr().out)
    merged["model"].pop("mode")  # the profile's keys are the learner's
    return merged


def _profile_keys(merged: dict) -> dict:
    """The profile's keys as printed; a game run prints no ``eval:`` (its data has no MBPP problems)."""
    model, evaluation = merged["model"], merged.get("eval")
    keys = {"model.micro_batch_size": model["micro_batch_size"],
            "model.gradient_checkpointing": model["gradient_checkpointing"],
            "model.vllm.gpu_memory_utilization": (model["vllm"] or {}).get("gpu_memory_utilization")}
    if evaluation is not None:
        keys.update({"eval.batch_size": evaluation["batch_size"], "eval.num_questions": evaluation["num_questions"]})
    return keys


@pytest.mark.parametrize("info, values", [(V100_16, V100_VALUES), (A100_80, A100_VALUES), (H100, H100_VALUES)])
def test_print_config_shows_the_profile_of_the_detected_gpu(monkeypatch, capsys, info, values):
    """The recipe sets eval.num_questions (5) itself; every other profile key comes from the GPU."""
    _fake_gpu(monkeypatch, info)
    merged = _print_config(capsys, "--config", str(RECIPE), "--model.rollout_backend", "vllm")
    assert _profile_keys(merged) == {**values, "eval.num_questions": 5}


def test_no_vllm_settings_without_the_vllm_backend(monkeypatch, capsys):
    _fake_gpu(monkeypatch, H100)
    merged = _print_config(capsys, "--config", str(RECIPE))
    assert merged["model"]["vllm"] is None
    assert _profile_keys(merged) == {**H100_VALUES, "model.vllm.gpu_memory_utilization": None, "eval.num_questions": 5}


def test_print_config_on_cpu_is_the_configs_own(monkeypatch, capsys):
    _fake_gpu(monkeypatch, PlatformInfo(cpu_count=2))
    merged = _print_config(capsys, "--config", str(RECIPE))
    assert _profile_keys(merged) == {"model.micro_batch_size": 8, "model.gradient_checkpointing": False,
                                     "model.vllm.gpu_memory_utilization": None, "eval.batch_size": None,
                                     "eval.num_questions": 5}


def test_keys_set_in_a_config_are_kept(monkeypatch, capsys, tmp_path):
    """Values in a YAML are kept, even a class default (micro-batch 8 on a V100, whose profile says 2),
    and a vLLM section that sets other fields still gets the profile's memory share."""
    _fake_gpu(monkeypatch, V100_16)
    user = tmp_path / "mine.yaml"
    user.write_text("model:\n  micro_batch_size: 8\n  vllm:\n    enable_sleep_mode: true\neval:\n  batch_size: 3\n")
    merged = _print_config(capsys, "--config", str(RECIPE), "--config", str(user), "--model.rollout_backend=vllm")
    assert _profile_keys(merged) == {"model.micro_batch_size": 8, "model.gradient_checkpointing": True,
                                     "model.vllm.gpu_memory_utilization": 0.25, "eval.batch_size": 3,
                                     "eval.num_questions": 5}
    assert merged["model"]["vllm"]["enable_sleep_mode"] is True


def test_keys_set_on_the_command_line_are_kept(monkeypatch, capsys):
    _fake_gpu(monkeypatch, V100_32)
    merged = _print_config(capsys, "--config", str(RECIPE), "--model.rollout_backend", "vllm",
                           "--model.gradient_checkpointing", "false",
                           "--model.vllm", '{"gpu_memory_utilization": 0.5}', "--eval.num_questions=null")
    assert _profile_keys(merged) == {"model.micro_batch_size": 2, "model.gradient_checkpointing": False,
                                     "model.vllm.gpu_memory_utilization": 0.5, "eval.batch_size": 8,
                                     "eval.num_questions": None}


@pytest.mark.parametrize("switch", [("--run.platform_profile", "off"), ("--run.platform_profile=false",)])
def test_the_switch_turns_the_profile_off(monkeypatch, capsys, switch):
    _fake_gpu(monkeypatch, H100)
    merged = _print_config(capsys, "--config", str(RECIPE), *switch)
    assert merged["run"]["platform_profile"] is False
    assert _profile_keys(merged)["model.micro_batch_size"] == 8  # the class default, not the profile's
    assert _profile_keys(merged)["eval.batch_size"] is None


def test_the_switch_in_a_config(monkeypatch, capsys, tmp_path):
    _fake_gpu(monkeypatch, V100_16)
    off = tmp_path / "off.yaml"
    off.write_text("run:\n  platform_profile: off\n")  # YAML reads off as false
    merged = _print_config(capsys, "--config", str(RECIPE), "--config", str(off))
    assert _profile_keys(merged)["model.micro_batch_size"] == 8 and merged["eval"]["batch_size"] is None


def test_the_platform_line_lists_what_was_chosen_and_kept(monkeypatch, capsys):
    """End to end through LightningCLI: the trainer and model are built with the profile's values (the
    tiny overlay's micro-batch kept), and the platform line says which values and how to override."""
    from rlcode.data.datamodule import MBPPDataModule
    from rlcode.training.learner import Learner

    _fake_gpu(monkeypatch, V100_16)
    built = cli.RLCodeCLI(Learner, MBPPDataModule, subclass_mode_model=False, subclass_mode_data=True, run=False,
                          auto_configure_optimizers=False,
                          args=["--config", str(REPO / "configs/quickstart.yaml"),
                                "--config", str(REPO / "configs/tiny_test.yaml"), "--trainer.accelerator", "cpu"])
    assert built.model.hparams.micro_batch_size == 4 and built.model.hparams.gradient_checkpointing is True
    assert built.model.hparams.vllm is None  # the hf backend: no engine to size
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("platform: "))
    assert line == (
        "platform: 1 x Tesla V100-SXM2-16GB (sm_70, 16 GiB); precision 16-mixed (chosen for this hardware); "
        "V100-class (before sm_80 or under 30 GiB) profile: model.gradient_checkpointing=true, "
        "eval.batch_size=8; from the config: model.micro_batch_size=4, "
        "eval.num_questions=2 (override one with --KEY VALUE or in a config; all with --run.platform_profile off)")


def test_the_platform_line_says_when_the_profile_is_off(monkeypatch, capsys):
    from rlcode.cli.platform_profile import ProfileChoice

    _fake_gpu(monkeypatch, H100)
    cli._choose_precision({"trainer": {"precision": "bf16-true"}, "model": {}}, ProfileChoice("H100-class",
                                                                                               switched_off=True))
    assert capsys.readouterr().out.strip().endswith("precision bf16-true (from the config); "
                                                    "H100-class profile off (run.platform_profile off)")


CONFIGS = sorted(path for path in (REPO / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=[path.name for path in CONFIGS])
def test_every_config_parses_with_the_profile_and_keeps_its_own_values(monkeypatch, capsys, config):
    """On a (faked) V100 every shipped config still parses, what it sets itself stays (null included),
    and the profile fills the rest."""
    _fake_gpu(monkeypatch, V100_16)
    base = {"tiny_test.yaml": ["quickstart.yaml"], "tiny_grpo.yaml": ["quickstart.yaml", "tiny_test.yaml"]}
    files = [REPO / "configs" / name for name in base.get(config.name, [])] + [config]
    own: dict = {}
    for path in files:
        own.update({key.replace("model.init_args.", "model.", 1): value
                    for key, value in _flatten(yaml.safe_load(path.read_text())).items()})
    merged = _profile_keys(_print_config(capsys, *[item for path in files for item in ("--config", str(path))]))
    for key, value in V100_VALUES.items():
        if key not in merged:
            assert key.startswith("eval.") and config.name.startswith("spiral_"), key
        elif key in own:
            assert merged[key] == own[key], key
        elif not key.startswith("model.vllm."):  # no config here uses the vllm backend
            assert merged[key] == value, key


# ---- the strategy on several GPUs: DDP when a copy of the training state fits a GPU's share, else FSDP ----

def gpus(count: int, info: PlatformInfo) -> PlatformInfo:
    return PlatformInfo(**{**info.__dict__, "gpu_count": count})


@pytest.mark.parametrize("info, parameters, lora, expected", [
    (gpus(8, H100), 7_600_000_000, False, "fsdp"),    # 7.6B x 16 B = 113 GiB > 0.6 x 79 GiB
    (gpus(8, H100), 1_540_000_000, False, "ddp"),     # 1.5B x 16 B = 23 GiB fits
    (gpus(8, H100), 7_600_000_000, True, "ddp"),      # LoRA: 7.6B frozen fp32 weights, 28 GiB
    (gpus(4, V100_32), 1_540_000_000, False, "fsdp"),  # 23 GiB > 0.6 x 31.7 GiB
    (H100, 7_600_000_000, False, None),               # one GPU: nothing to choose
    (PlatformInfo(cpu_count=8), 7_600_000_000, False, None),
])
def test_the_strategy_follows_the_training_state_and_the_gpu(info, parameters, lora, expected):
    from rlcode.platform import sharding_choice, training_state_bytes

    choice = sharding_choice(info, training_state_bytes(parameters, lora=lora))
    assert (choice and choice[0]) == expected


def _model_folder(tmp_path: Path, **shape) -> Path:
    """A config.json alone: the choice reads the parameter count off the config (meta device), no weights."""
    from transformers import Qwen2Config

    folder = tmp_path / "model"
    Qwen2Config(**shape).save_pretrained(folder)
    return folder


QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                 num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False)


def test_several_gpus_pick_fsdp_for_a_model_that_does_not_fit_and_say_why(monkeypatch, capsys, tmp_path):
    from rlcode.data.datamodule import MBPPDataModule
    from rlcode.training.fsdp_strategy import FSDP2Strategy
    from rlcode.training.learner import Learner

    _fake_gpu(monkeypatch, gpus(8, H100))
    folder = _model_folder(tmp_path, **QWEN25_7B)
    assert _print_config(capsys, "--config", str(RECIPE), "--model.model_name", str(folder))["trainer"]["strategy"] == "fsdp"
    built = cli.RLCodeCLI(Learner, MBPPDataModule, subclass_mode_model=False, subclass_mode_data=True, run=False,
                          auto_configure_optimizers=False,
                          args=["--config", str(RECIPE), "--model.model_name", str(folder), "--trainer.accelerator", "cpu",
                                "--trainer.devices", "1"])
    assert isinstance(built.trainer.strategy, FSDP2Strategy)  # the word "fsdp" is rlcode's FSDP2, not Lightning's FSDP1
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("platform: "))
    # Qwen2.5-7B's 7.62B parameters x 16 bytes = 113.5 GiB; 0.6 of the H100's 79.1 GiB = 47.5 GiB
    assert "trainer.strategy=fsdp (training state 113.5 GiB, 60% of one GPU 47.5 GiB: sharded over 8 GPUs)" in line, line


def test_several_gpus_keep_ddp_for_a_model_that_fits_and_a_strategy_the_user_set(monkeypatch, capsys, tmp_path):
    _fake_gpu(monkeypatch, gpus(8, H100))
    small = _model_folder(tmp_path, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=512)
    assert _print_config(capsys, "--config", str(RECIPE), "--model.model_name", str(small))["trainer"]["strategy"] == "ddp"
    big = _model_folder(tmp_path / "big", **QWEN25_7B)
    kept = _print_config(capsys, "--config", str(RECIPE), "--model.model_name", str(big), "--trainer.strategy", "ddp")
    assert kept["trainer"]["strategy"] == "ddp"
    _fake_gpu(monkeypatch, H100)  # one GPU: the recipe's own (auto)
    assert _print_config(capsys, "--config", str(RECIPE), "--model.model_name", str(big))["trainer"]["strategy"] == "auto"


def test_fsdp_on_gpus_without_bf16_trains_in_32_true(monkeypatch, capsys, tmp_path):
    """16-mixed (the V100 choice) needs loss scaling that FSDP2 does not do under Lightning: with FSDP
    (picked, or set) the automatic precision is 32-true there, and a 16-mixed set by hand is refused."""
    from rlcode.data.datamodule import MBPPDataModule
    from rlcode.models.sharding import precision_policy
    from rlcode.training.learner import Learner

    _fake_gpu(monkeypatch, gpus(4, V100_32))
    big = _model_folder(tmp_path, **QWEN25_7B)
    for strategy, precision in ((None, "32-true"), ("ddp", "16-mixed")):
        chosen = ["--trainer.strategy", strategy] if strategy else []
        built = cli.RLCodeCLI(Learner, MBPPDataModule, subclass_mode_model=False, subclass_mode_data=True, run=False,
                              auto_configure_optimizers=False,
                              args=["--config", str(RECIPE), "--model.model_name", str(big), "--trainer.accelerator",
                                    "cpu", "--trainer.devices", "1", *chosen])
        assert built.config["trainer"]["precision"] == precision, strategy
    line = [line for line in capsys.readouterr().out.splitlines() if line.startswith("platform: ")][0]
    assert "precision 32-true (chosen for FSDP on a GPU without bf16)" in line and "trainer.strategy=fsdp" in line
    with pytest.raises(ValueError, match="FSDP does not train in 16-mixed.*32-true"):
        precision_policy("16-mixed")


# ---- a preview from a machine without the GPU ----------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("h100x4", {"precision": "bf16-mixed", "strategy": "ddp", "gradient_checkpointing": False}),
    ("a100", {"precision": "bf16-mixed", "strategy": "auto", "gradient_checkpointing": True}),
    ("v100x2", {"precision": "16-mixed", "strategy": "ddp", "gradient_checkpointing": True}),
])
def test_a_named_gpu_previews_its_profile_and_precision_on_a_cpu(monkeypatch, capsys, name, expected):
    """A login node had no way to see what a GPU job would get (--print_config showed the class
    defaults). Detection stays the CPU's here: the preview alone decides."""
    _fake_gpu(monkeypatch, PlatformInfo(cpu_count=2))
    merged = _print_config(capsys, "--config", str(REPO / "configs/quickstart.yaml"), "--run.platform_profile", name)
    shown = {"precision": merged["trainer"]["precision"], "strategy": merged["trainer"]["strategy"],
             "gradient_checkpointing": merged["model"]["gradient_checkpointing"]}
    assert shown == expected


def test_a_preview_of_fsdp_on_v100s_trains_in_32_bit(monkeypatch, capsys):
    _fake_gpu(monkeypatch, PlatformInfo(cpu_count=2))
    merged = _print_config(capsys, "--config", str(REPO / "configs/quickstart.yaml"), "--run.platform_profile",
                           "v100x4", "--trainer.strategy", "fsdp")
    assert merged["trainer"]["precision"] == "32-true"


def test_a_gpu_that_cannot_be_previewed_is_one_line_naming_those_that_can(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["fit", "--config", str(REPO / "configs/quickstart.yaml"), "--run.platform_profile", "h200",
                  "--print_config"])
    assert "run.platform_profile 'h200' is not a GPU to preview: use v100, a100 or h100" in str(stop.value.code)
