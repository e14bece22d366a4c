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
import gpu_check_pairs  # noqa: E402

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
    pairs = [f"{side}_{pair}" for pair in gpu_check_pairs.PAIRS for side in ("rlcode", "trl")]
    for name in (*pairs, "fp16_mixed", "qlora_4bit", "spiral", "fsdp"):
        assert checks[name]["optimizer_steps"] == 1, name
    for pair in gpu_check_pairs.PAIRS:  # both sides of a pair: the same shape and settings
        ours, theirs = checks[f"rlcode_{pair}"], checks[f"trl_{pair}"]
        shared = ("rows", "prompts", "new_tokens", "prompt_tokens", "gradient_checkpointing", "lora_r",
                  "trained_parameters")
        assert [ours[key] for key in shared] == [theirs[key] for key in shared], pair
        assert ours["tokens_per_s"] > 0 and theirs["tokens_per_s"] > 0, pair
    assert checks["rlcode_64x512"]["prompt_tokens"] > checks["rlcode_16x128"]["prompt_tokens"]  # the task repeated
    assert checks["rlcode_64x512_lora"]["trained_parameters"] < checks["rlcode_64x512"]["trained_parameters"] / 2
    assert checks["rlcode_64x512_lora"]["lora_r"] == 16 and checks["trl_64x512_ckpt"]["gradient_checkpointing"]
    assert checks["fsdp"]["devices"] == 2  # sharded over 2 CPU processes in the dry run
    assert checks["fp16_mixed"]["precision"] == "bf16-mixed"  # no fp16 autocast on the CPU
    packed = checks["packed_pass"]
    for figures in (packed, packed["64x512"]):  # bf16 autocast rounding; a wrong pass is off by nats
        assert figures["max_abs_logp_difference"] < 0.1 and figures["packed_s"] > 0 and figures["plain_s"] > 0
    assert set(checks["rlcode_64x512"]["stage_s"][0]) >= {"generation", "update", "step"}  # where the step's time went
    generation = checks["generation"]
    assert 0 < generation["rlcode_loop_tokens"] <= generation["rows"] * generation["new_tokens"]
    assert generation["rlcode_loop_s"] > 0 and generation["generate_s"] > 0
    # The decode step against its weight-streaming floor, at 16 and 64 rows; launches counted (aten ops on a CPU).
    assert generation["floor_ms"] > 0 and set(generation["floor_ratio"]) == {"16", "64"}
    assert all(ratio > 0 for ratio in generation["floor_ratio"].values())
    assert generation["kernels_per_decode_step"] is None and generation["aten_ops_per_decode_step"] > 0
    assert generation["compile_s"] is None  # the loop is eager
    # p5 for every pair, both sides in the same call; the CPU has no peak GPU memory and says nothing of the goal.
    p5 = _results(tmp_path / "a")["p5"]
    for pair in gpu_check_pairs.PAIRS:
        assert p5[pair]["tokens_per_s_ratio"] > 0 and p5[pair]["peak_memory_ratio"] is None, pair
    assert p5["goal"] == gpu_check.P5_GOAL and p5["goal_met"] is None and "not_measured" not in p5
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
                           "--checks", "platform", "model", "packed_pass", "--total-budget", "0.2"])
    checks = _results(tmp_path / "b")["checks"]
    assert code == 1
    assert [checks[name]["status"] for name in ("platform", "model", "packed_pass")] == ["over_budget", "not_run", "skipped"]


def _side(tokens_per_s: float, peak_gpu_gb: float, status: str = "ok") -> dict:
    return {"status": status, "tokens_per_s": tokens_per_s, "peak_gpu_gb": peak_gpu_gb}


def test_the_p5_figure_compares_rlcode_with_trl_per_size_and_setting():
    checks = {"rlcode_64x512": _side(300.0, 20.0), "trl_64x512": _side(100.0, 40.0),  # 3x at 0.5x: met
              "rlcode_64x512_lora": _side(250.0, 9.0), "trl_64x512_lora": _side(100.0, 20.0),  # 2.5x at 0.45x: met
              "rlcode_16x128": _side(150.0, 12.0), "trl_16x128": _side(100.0, 10.0)}  # not in the goal
    p5 = gpu_check.p5_figure(checks)
    assert p5 == {"64x512": {"tokens_per_s_ratio": 3.0, "peak_memory_ratio": 0.5},
                  "64x512_lora": {"tokens_per_s_ratio": 2.5, "peak_memory_ratio": 0.45},
                  "16x128": {"tokens_per_s_ratio": 1.5, "peak_memory_ratio": 1.2},
                  "goal": gpu_check.P5_GOAL, "goal_met": True}
    checks["trl_64x512"]["peak_gpu_gb"] = 24.0  # 0.83x the memory: a full fine-tune's goal asks <= 0.75x
    assert gpu_check.p5_figure(checks)["goal_met"] is False
    checks["trl_64x512"]["peak_gpu_gb"] = 40.0
    checks["trl_64x512_lora"]["peak_gpu_gb"] = 15.0  # 0.6x: LoRA's goal asks <= 0.5x
    assert gpu_check.p5_figure(checks)["goal_met"] is False
    assert gpu_check.p5_figure(checks, dry_run=True)["goal_met"] is None  # CPU figures say nothing of a GPU's


def test_a_pair_without_both_sides_in_the_call_has_no_figure():
    checks = {"rlcode_64x512": _side(300.0, 20.0), "trl_64x512": {"status": "over_budget"},
              "rlcode_64x512_lora": _side(250.0, 9.0), "trl_64x512_lora": _side(100.0, 20.0)}
    p5 = gpu_check.p5_figure(checks)
    assert "64x512" not in p5 and p5["not_measured"] == {"64x512": "rlcode_64x512 ok, trl_64x512 over_budget"}
    assert p5["goal_met"] is None  # LoRA meets its goal; the full fine-tune is not known
    checks["rlcode_64x512_lora"]["tokens_per_s"] = 150.0  # 1.5x: one pair missing the goal is enough to say so
    assert gpu_check.p5_figure(checks)["goal_met"] is False
    assert gpu_check.p5_figure({}) == {"goal": gpu_check.P5_GOAL, "goal_met": None}


def test_the_pairs_run_first_and_the_most_telling_first():
    order = list(gpu_check.BUDGETS_S)
    pairs = [f"{side}_{pair}" for pair in gpu_check_pairs.PAIRS for side in ("rlcode", "trl")]
    assert order[:2 + len(pairs)] == ["platform", "model", *pairs]
    assert gpu_check_pairs.PAIRS == ["64x512", "64x512_lora", "64x512_ckpt", "16x128"]


def test_a_budget_for_an_unknown_check_is_one_line():
    with pytest.raises(SystemExit, match="expected CHECK=SECONDS with CHECK one of platform"):
        gpu_check.main(["--dry-run", "--budget", "grpo=3"])


def test_every_budgeted_check_exists_and_every_check_has_a_budget():
    checks, needs_no_model = gpu_check.checks_registry()
    assert set(checks) == set(gpu_check.BUDGETS_S)
    assert needs_no_model <= set(checks)
