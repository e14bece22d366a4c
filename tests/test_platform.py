"""Platform detection and the precision it picks, with made-up hardware."""

import pytest

from rlcode.platform import PlatformInfo, default_eval_batch_size, default_precision, detect_platform, supports_bf16


def gpu(capability, name="GPU"):
    return PlatformInfo(device_type="cuda", gpu_name=name, gpu_count=1, compute_capability=capability,
                        gpu_memory_bytes=16 * 2**30, cpu_count=8)


@pytest.mark.parametrize(
    "capability, expected",
    [((9, 0), "bf16-mixed"), ((8, 0), "bf16-mixed"), ((8, 6), "bf16-mixed"), ((7, 5), "16-mixed"), ((7, 0), "16-mixed"), ((6, 0), "16-mixed")],
)
def test_bf16_only_from_compute_capability_8(capability, expected):
    assert default_precision(gpu(capability)) == expected


def test_v100_gets_fp16_mixed_even_though_torch_claims_bf16_support():
    v100 = gpu((7, 0), "Tesla V100-SXM2-32GB")
    assert not supports_bf16(v100)
    assert default_precision(v100) == "16-mixed"


def test_cpu_trains_in_fp32():
    cpu = PlatformInfo(cpu_count=2)
    assert default_precision(cpu) == "32-true"


def test_detect_platform_reads_the_gpu_and_slurm(monkeypatch):
    """detect_platform reports what torch.cuda says about the device (faked here: an A100 pair)."""
    from types import SimpleNamespace

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(
        name="NVIDIA A100-SXM4-80GB", major=8, minor=0, total_memory=80 * 2**30))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    info = detect_platform()
    assert (info.device_type, info.gpu_count, info.compute_capability) == ("cuda", 2, (8, 0))
    assert info.in_slurm and info.slurm_job_id == "4242"
    assert info.slurm_environment["SLURM_NTASKS"] == "2"
    assert info.describe() == "2 x NVIDIA A100-SXM4-80GB (sm_80, 80 GiB), SLURM job 4242"
    assert default_precision(info) == "bf16-mixed"


def test_detect_platform_without_a_gpu(monkeypatch):
    import os

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    info = detect_platform()
    assert info.device_type == "cpu" and info.gpu_name is None and info.compute_capability is None
    assert info.cpu_count == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("local_ranks, expected", [(1, 8), (2, 4), (8, 1), (16, 1)])
def test_sandbox_workers_share_the_node_among_its_ranks(local_ranks, expected):
    """Each DDP rank's pool gets its share of the node's cores, not all of them."""
    from rlcode.platform import default_sandbox_workers

    assert default_sandbox_workers(local_ranks, PlatformInfo(cpu_count=8)) == expected


def test_no_slurm_without_its_variables(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    assert not detect_platform().in_slurm


@pytest.mark.parametrize("capability, expected", [((7, 0), "16-mixed"), ((8, 0), "bf16-mixed"), ((9, 0), "bf16-mixed"),
                                                  (None, "32-true")])
def test_unset_trainer_precision_is_chosen_from_the_hardware(monkeypatch, capsys, capability, expected):
    """With trainer.precision unset the CLI picks it from the detected GPU (and the
    model's weight precision with it) and prints the platform line; a set precision is kept."""
    import rlcode.platform
    from rlcode.cli import command as cli

    info = gpu(capability, "Tesla V100") if capability else PlatformInfo(cpu_count=2)
    monkeypatch.setattr(rlcode.platform, "detect_platform", lambda: info)
    config = {"trainer": {"precision": None}, "model": {"precision": "32-true"}}
    cli._choose_precision(config)
    assert config["trainer"]["precision"] == expected and config["model"]["precision"] == expected
    assert f"precision {expected} (chosen for this hardware)" in capsys.readouterr().out

    config = {"trainer": {"precision": "32-true"}, "model": {"precision": "32-true"}}
    cli._choose_precision(config)
    assert config["trainer"]["precision"] == "32-true"
    assert "precision 32-true (from the config)" in capsys.readouterr().out


def test_cli_builds_the_trainer_with_the_chosen_precision(monkeypatch):
    """End to end through LightningCLI: an A100 (faked) gets a bf16-mixed trainer and model."""
    from pathlib import Path

    import rlcode.platform
    from rlcode.cli import command as cli
    from rlcode.training.learner import Learner
    from rlcode.data.datamodule import MBPPDataModule

    monkeypatch.setattr(rlcode.platform, "detect_platform", lambda: gpu((8, 0), "A100"))
    repo = Path(__file__).resolve().parents[1]
    built = cli.RLCodeCLI(Learner, MBPPDataModule, subclass_mode_model=False, subclass_mode_data=True, run=False,
                          auto_configure_optimizers=False,
                          args=["--config", str(repo / "configs/quickstart.yaml"),
                                "--config", str(repo / "configs/tiny_test.yaml"), "--trainer.accelerator", "cpu"])
    assert built.trainer.precision == "bf16-mixed" and built.model.hparams.precision == "bf16-mixed"


def test_eval_batch_size_is_larger_on_a_gpu():
    assert default_eval_batch_size("cpu") == 16
    assert default_eval_batch_size("cuda") == 32
