"""The GPU check's one command (benchmarks/gpu_lease.sh) in its dry run against the lent machine's
versions: `make test-device-stack` builds a venv of the image's packages (transformers 5.17.0,
huggingface_hub 1.33.0, lightning 2.6.6, ...; benchmarks/device_image.txt) and nothing else, plus
the wheels `device_wheels.py` carries, and points RLCODE_DEVICE_STACK at it. What cannot be
reproduced here: the device's Python 3.12, numpy 2.5 and torch 2.11+cu130 (this machine's torch is
2.13's CPU wheel for Python 3.11); the check's JSON records what the device really had."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import device_wheels  # noqa: E402

STACK = os.environ.get("RLCODE_DEVICE_STACK")


@pytest.mark.slow
@pytest.mark.skipif(not STACK, reason="needs the device-stack venv: run `make test-device-stack`")
def test_the_lease_command_dry_runs_on_the_device_versions(tmp_path):
    stack = Path(STACK).resolve()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(PYTHON=str(stack / "bin" / "python"), WHEELS=str(stack / "wheels"), SITE=str(tmp_path / "site"))
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_lease.sh"), "--dry-run", "--out", str(tmp_path / "out"),
                          "--work-dir", str(tmp_path)], env=env, capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (path,) = (tmp_path / "out").glob("gpu_check_*.json")
    results = json.loads(path.read_text())
    statuses = {name: check["status"] for name, check in results["checks"].items()}
    assert statuses == {**{name: "ok" for name in statuses}, "vllm": "skipped"}  # the image has no vLLM
    versions, image, locked = results["versions"], device_wheels.image_packages(), device_wheels.locked_versions()
    for name in ("transformers", "huggingface-hub", "lightning", "accelerate"):  # the image's, not the dev venv's
        assert versions[name] == image[name], name
    for name in ("trl", "datasets", "bitsandbytes", "textarena", "jsonargparse"):  # carried, from the lock
        assert versions[name] == locked[name], name
