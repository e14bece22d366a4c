"""Platform detection and the precision it picks, with made-up hardware."""

import pytest

from rlcode.platform import PlatformInfo, default_accelerator, default_precision, detect_platform, supports_bf16


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
    assert default_accelerator(cpu) == "cpu"
    assert default_accelerator(gpu((8, 0))) == "gpu"


def test_detect_platform_on_this_machine_is_consistent(monkeypatch):
    import torch

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    info = detect_platform()
    assert info.device_type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert info.in_slurm and info.slurm_job_id == "4242"
    assert info.slurm_environment["SLURM_NTASKS"] == "2"
    assert info.cpu_count >= 1
    assert "SLURM job 4242" in info.describe()


def test_no_slurm_without_its_variables(monkeypatch):
    for name in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(name, raising=False)
    assert not detect_platform().in_slurm
