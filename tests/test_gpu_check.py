"""benchmarks/gpu_check.py --dry-run: the GPU check's code runs on the CPU with a 2-layer model, every
check included (the vLLM one against the strict stand-in), so the command is known to work before a
GPU machine runs it."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import vllm_stand_in

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_the_dry_run_runs_every_check(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", script)  # the GRPO reward "gpu_check:length_reward"
    spec.loader.exec_module(script)
    checks, codes = {}, []
    others = [name for name in script.CHECKS if name != "vllm"]
    # TRL looks for an installed vllm: the stand-in is there for the vLLM check only
    for names, stand_in in ((others, None), (["vllm"], vllm_stand_in.module())):
        if stand_in is not None:
            monkeypatch.setitem(sys.modules, "vllm", stand_in)
        results_path = tmp_path / "results.json"
        codes.append(script.main(["--dry-run", "--work-dir", str(tmp_path), "--json", str(results_path),
                                  "--checks", *names]))
        checks.update(json.loads(results_path.read_text())["checks"])
    assert {name: check.get("error") for name, check in checks.items() if "error" in check} == {}
    assert codes == [0, 0] and sorted(checks) == sorted(script.CHECKS)
    assert checks["grpo_bf16"]["rlcode"]["optimizer_steps"] == 1 and checks["grpo_bf16"]["trl"]["optimizer_steps"] == 1
    assert checks["fp16_mixed"]["precision"] == "bf16-mixed"  # no fp16 autocast on the CPU
    for name in ("qlora_4bit", "spiral"):
        assert checks[name]["optimizer_steps"] == 1, name
    shared = checks["shared_prefix"]
    assert shared["max_abs_logp_difference"] < 0.1  # bf16 autocast: rounding only (a wrong pass is off by nats)
    vllm = checks["vllm"]
    assert vllm["smoke"] == "needs CUDA: not run" and vllm["tokens"] > 0
    assert 0 < vllm["importance_weight_min"] <= vllm["importance_weight_mean"] <= 3.0
