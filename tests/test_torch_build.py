"""The torch build against the GPU: `rlcode fit` refuses a build without the GPU's kernels (stand-in
devices and arch lists), and `make setup` picks the cu126 index for GPUs before CUDA 13 (a stand-in
nvidia-smi on PATH, read through `make -n`)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import rlcode.platform
from rlcode.cli import command as cli
from rlcode.cli.errors import UserError
from rlcode.platform import CU126_INDEX, PlatformInfo, build_runs_on, torch_build_problem

REPO = Path(__file__).resolve().parents[1]
# torch 2.13's CUDA 13 build (PyPI's): Turing on, PTX of the newest for what comes after
CU13 = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
CU126 = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


def gpu(capability, name, arch_list=CU13):
    return PlatformInfo(device_type="cuda", gpu_name=name, gpu_count=1, compute_capability=capability,
                        gpu_memory_bytes=32 * 2**30, torch_arch_list=arch_list, torch_version="2.13.0+cu130")


def test_a_v100_with_the_cuda13_build_is_told_the_cu126_index_in_one_line():
    problem = torch_build_problem(gpu((7, 0), "Tesla V100-SXM2-32GB"))
    assert "\n" not in problem and "sm_70" in problem and "Tesla V100" in problem
    assert f"'torch==2.13.0+cu126' --extra-index-url {CU126_INDEX}" in problem


def test_an_h100_with_the_same_build_is_fine():
    assert torch_build_problem(gpu((9, 0), "NVIDIA H100 80GB HBM3")) is None


@pytest.mark.parametrize("capability, arch_list, runs", [
    ((8, 6), ("sm_80",), True),  # a binary runs on later minors of its major
    ((8, 0), ("sm_86",), False),  # ... not on earlier ones
    ((10, 0), ("sm_90",), False),  # ... nor on another major
    ((10, 0), ("sm_90", "compute_90"), True),  # PTX is compiled for any later GPU
    ((7, 0), ("compute_75",), False),  # ... never for an earlier one
    ((9, 0), ("sm_90a",), True), ((10, 0), ("sm_90a",), False),  # "a": its own GPU only
    ((12, 1), ("sm_120f",), True),  # "f": its family
    ((7, 0), CU126, True), ((6, 1), CU126, True), ((12, 0), CU126, False),
])
def test_which_builds_run_on_which_gpu(capability, arch_list, runs):
    assert build_runs_on(arch_list, capability) is runs


def test_no_verdict_on_a_cpu_or_a_build_that_lists_nothing():
    assert torch_build_problem(PlatformInfo(cpu_count=2)) is None
    assert torch_build_problem(gpu((7, 0), "V100", arch_list=())) is None


def test_a_newer_gpu_than_the_build_is_told_to_find_a_build_for_it():
    problem = torch_build_problem(gpu((12, 0), "RTX 5090", arch_list=CU126))
    assert "sm_120" in problem and "cu126" not in problem.split(":", 1)[1]


def test_the_cli_refuses_before_building_anything(monkeypatch):
    monkeypatch.setattr(rlcode.platform, "detect_platform", lambda: gpu((7, 0), "Tesla V100"))
    with pytest.raises(UserError, match="cu126"):
        cli._choose_precision({"trainer": {"precision": None}, "model": {}})


def make_setup_line(tmp_path: Path, compute_caps: str | None, *overrides: str) -> str:
    """The torch install line `make setup` would run, with a stand-in nvidia-smi printing
    ``compute_caps`` (None: one that fails, as without a driver)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\n" + (f"printf '{compute_caps}\\n'\n" if compute_caps else "exit 9\n"))
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    env.pop("TORCH_INDEX", None)
    done = subprocess.run(["make", "-n", "setup", f"VENV={tmp_path / 'venv'}", *overrides], cwd=REPO, env=env,
                          capture_output=True, text=True, check=True)
    (line,) = [line for line in done.stdout.splitlines() if "pip install" in line and "torch==" in line]
    return line


def test_make_setup_takes_cu126_for_a_v100(tmp_path):
    assert f"--extra-index-url {CU126_INDEX}" in make_setup_line(tmp_path, "7.0")
    assert f"--extra-index-url {CU126_INDEX}" in make_setup_line(tmp_path, "9.0\\n7.0")  # the oldest GPU decides


@pytest.mark.parametrize("compute_caps", ["7.5", "9.0", None, "NVIDIA-SMI has failed"])
def test_make_setup_keeps_pypis_build_elsewhere(tmp_path, compute_caps):
    assert "--extra-index-url" not in make_setup_line(tmp_path, compute_caps)


def test_the_user_overrides_the_choice(tmp_path):
    assert "--extra-index-url" not in make_setup_line(tmp_path, "7.0", "TORCH_INDEX=")
    cpu = "https://download.pytorch.org/whl/cpu"
    assert f"--extra-index-url {cpu}" in make_setup_line(tmp_path, "7.0", f"TORCH_INDEX={cpu}")
