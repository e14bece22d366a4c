"""benchmarks/gpu_check.py: every check's code runs on the CPU in its dry run (the vLLM one against the
strict stand-in), each in its own process, and a check past its time budget is reported while the rest
still run, so the one command is known to work before a GPU lease spends its minutes on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import gpu_check  # noqa: E402

TESTS = Path(__file__).resolve().parent


def _results(out: Path) -> dict:
    (path,) = out.glob("gpu_check_*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_the_dry_run_runs_every_check(tmp_path, monkeypatch):
    others = [name for name in gpu_check.BUDGETS_S if name != "vllm"]
    common = ["--dry-run", "--work-dir", str(tmp_path)]
    assert gpu_check.main([*common, "--out", str(tmp_path / "a"), "--checks", *others]) == 0
    checks = _results(tmp_path / "a")["checks"]
    # The vLLM check's process imports the stand-in as `vllm` (TRL's process must not: it looks for one).
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "vllm.py").write_text("import sys, vllm_stand_in\nsys.modules[__name__] = vllm_stand_in.module()\n")
    monkeypatch.setenv("PYTHONPATH", f"{shim}:{TESTS}")
    assert gpu_check.main([*common, "--out", str(tmp_path / "b"), "--checks", "vllm"]) == 0
    checks.update(_results(tmp_path / "b")["checks"])

    assert {name: check["status"] for name, check in checks.items()} == dict.fromkeys(gpu_check.BUDGETS_S, "ok")
    assert checks["platform"]["line"].startswith("platform: CPU") and checks["platform"]["precision"] == "32-true"
    for name in ("grpo_bf16", "trl_bf16", "fp16_mixed", "qlora_4bit", "spiral", "fsdp"):
        assert checks[name]["optimizer_steps"] == 1, name
    assert checks["fsdp"]["devices"] == 2  # sharded over 2 CPU processes in the dry run
    assert checks["fp16_mixed"]["precision"] == "bf16-mixed"  # no fp16 autocast on the CPU
    assert checks["shared_prefix"]["max_abs_logp_difference"] < 0.1  # bf16 autocast rounding; a wrong pass is off by nats
    assert set(checks["grpo_bf16"]["stage_s"][0]) >= {"generation", "update", "step"}  # where the step's time went
    generation = checks["generation"]
    assert 0 < generation["rlcode_loop_tokens"] <= generation["rows"] * generation["new_tokens"]
    assert generation["rlcode_loop_s"] > 0 and generation["generate_s"] > 0
    linears = checks["quantized_linears"]
    assert linears["int8_sampler"] == "runs here (CPU)"
    # Both operands rounded to e4m3 (3 mantissa bits: <= 2^-4 relative each) put a product within
    # (1 + 2^-4)^2 - 1 of its value; int8's 127 levels per row are finer. A wrong scale or layout is off by O(1).
    bound = (1 + 2**-4) ** 2 - 1
    for kind in ("fp8", "int8"):
        assert 0 < linears[f"{kind}_rows32_relative_error"] < bound, kind
    vllm = checks["vllm"]
    assert vllm["smoke"] == "needs CUDA: not run" and vllm["tokens"] > 0
    assert 0 < vllm["importance_weight_min"] <= vllm["importance_weight_mean"] <= 3.0
    assert (tmp_path / "a" / "gpu_check.log").stat().st_size > 0


@pytest.mark.slow
def test_a_check_past_its_budget_is_reported_and_the_rest_still_run(tmp_path):
    # 0.2 s cannot hold a check: its process imports torch first (over a second here).
    code = gpu_check.main(["--dry-run", "--work-dir", str(tmp_path), "--out", str(tmp_path / "a"),
                           "--checks", "platform", "model", "--budget", "platform=0.2"])
    checks = _results(tmp_path / "a")["checks"]
    assert code == 1 and checks["platform"]["status"] == "over_budget" and checks["model"]["status"] == "ok"
    # The whole run's budget: spent by the first check, the next is not started, and one needing the
    # model folder is skipped when the model step did not run.
    code = gpu_check.main(["--dry-run", "--work-dir", str(tmp_path / "w"), "--out", str(tmp_path / "b"),
                           "--checks", "platform", "model", "shared_prefix", "--total-budget", "0.2"])
    checks = _results(tmp_path / "b")["checks"]
    assert code == 1
    assert [checks[name]["status"] for name in ("platform", "model", "shared_prefix")] == ["over_budget", "not_run", "skipped"]


def test_the_p5_figure_compares_rlcode_with_trl_on_the_same_steps():
    checks = {"grpo_bf16": {"status": "ok", "tokens_per_s": 300.0, "peak_gpu_gb": 10.0},
              "trl_bf16": {"status": "ok", "tokens_per_s": 100.0, "peak_gpu_gb": 40.0}}
    assert gpu_check.p5_figure(checks) == {"goal": gpu_check.P5_GOAL, "tokens_per_s_ratio": 3.0,
                                           "peak_memory_ratio": 0.25, "goal_met": True}
    checks["trl_bf16"]["peak_gpu_gb"] = 15.0  # 0.67x the memory: the goal asks <= 0.5x
    assert gpu_check.p5_figure(checks)["goal_met"] is False
    checks["trl_bf16"] = {"status": "over_budget"}
    assert gpu_check.p5_figure(checks)["status"] == "not measured"


def test_a_budget_for_an_unknown_check_is_one_line():
    with pytest.raises(SystemExit, match="expected CHECK=SECONDS with CHECK one of platform"):
        gpu_check.main(["--dry-run", "--budget", "grpo=3"])


def test_every_budgeted_check_exists_and_every_check_has_a_budget():
    checks, needs_no_model = gpu_check.checks_registry()
    assert set(checks) == set(gpu_check.BUDGETS_S)
    assert needs_no_model <= set(checks)
