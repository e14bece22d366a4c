"""`rlcode fit` end to end on the tiny random model with the real sandbox rewards (seconds each)."""

from __future__ import annotations

import csv
import json
import os
import signal
from pathlib import Path

import pytest
import torch

from rlcode.cli.command import main

REPO = Path(__file__).resolve().parents[1]
BASE = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml")]


# The sandbox rewards give a random model's garbage the same score every time (all syntax errors):
# groups with zero variance, advantages 0, no update. A length reward varies, so weights move.
WITH_SIGNAL = ["--model.mode.rewards", "[execution, 'test_grpo_fit:length_reward']"]


def length_reward(prompts, completions, **columns) -> list[float]:
    return [len(text) / 100.0 for text in completions]


def fit(root: Path, *extra: str) -> Path:
    main(["fit", *BASE, "--run.root_dir", str(root), *WITH_SIGNAL, *extra])
    versions = sorted((root / "tiny").glob("version_*"))
    assert versions, f"no run directory under {root}"
    return versions[-1]


def policy_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


def initial_weights() -> dict[str, torch.Tensor]:
    from rlcode.models import load_model

    return {f"policy.{k}": v for k, v in load_model("tiny-random").state_dict().items()}


def rollout_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]


def test_fit_leaves_a_complete_run_directory(tmp_path, capsys):
    run = fit(tmp_path, "--eval.batch_size", "1")
    for name in ("config.yaml", "metrics.csv", "rollouts.jsonl", "plots/training.png",
                 "checkpoints/step-1.ckpt", "checkpoints/step-2.ckpt", "checkpoints/last.ckpt",
                 "eval/step_0.json", "eval/step_2.json"):
        assert (run / name).is_file(), name

    with (run / "metrics.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    columns = set(rows[0])
    for name in ("reward/avg_batch_reward", "reward/execution", "reward/successful_predictions_count",
                 "reward/frac_reward_zero_std", "completions/mean_length", "loss/clip_frac_region",
                 "perf/tokens_per_s", "perf/rewards_s", "mbpp_eval/pass_rate", "mbpp_eval/problems_passed"):
        assert name in columns, name
    assert len([r for r in rows if r["reward/avg_batch_reward"]]) == 2

    report = json.loads((run / "eval/step_2.json").read_text())
    assert report["step"] == 2 and len(report["problems"]) == 2
    assert {"task_id", "passed", "verdict", "completion"} <= set(report["problems"][0])

    assert {row["step"] for row in rollout_rows(run)} == {0, 1}
    out = capsys.readouterr().out
    assert "rlcode fit finished: 2 optimizer steps" in out and str(run) in out
    # The eval's progress: a line per batch but the last, whose line is the eval's summary (on stderr).
    assert "  MBPP eval at step 0 (validation): 1/2 problems, pass rate 0.000 (0/1), " in out
    assert "  MBPP eval at step 0 (validation): 2/2 problems" not in out

    trained, start = policy_weights(run / "checkpoints/last.ckpt"), initial_weights()
    assert any(not torch.equal(trained[k], start[k]) for k in start), "the optimizer never changed the weights"


def test_dry_run_generates_and_scores_but_never_updates(tmp_path, capsys):
    """It used to end with "2 optimizer steps", "Training complete!" and a checkpoint of unchanged weights."""
    run = fit(tmp_path, "--model.dry_run", "true", "--eval.at_start", "false", "--eval.at_end", "false")
    assert {row["step"] for row in rollout_rows(run)} == {0, 1}  # steps are counted (max_steps ends it)
    out = capsys.readouterr().out
    assert out.count("(no update)") == 2
    assert "rlcode fit (dry run) finished 2 steps in" in out and "no weight updates, no checkpoint" in out
    assert "optimizer steps" not in out and "Training complete!" not in out and "checkpoint:" not in out
    assert not list(run.rglob("*.ckpt")), "a dry run writes no checkpoint"


def test_resume_from_last_continues_at_the_same_step_and_data_order(tmp_path):
    quiet = ["--eval.at_start", "false", "--eval.at_end", "false"]
    straight = fit(tmp_path / "straight", "--trainer.max_steps", "4", *quiet)
    fit(tmp_path / "resumed", "--trainer.max_steps", "2", *quiet)
    resumed = fit(tmp_path / "resumed", "--trainer.max_steps", "4", "--ckpt_path", "last", *quiet)

    assert resumed.name == "version_0", "resuming must continue in the interrupted run's directory"
    order = [(row["step"], row["task_id"]) for row in rollout_rows(straight)]
    assert [(row["step"], row["task_id"]) for row in rollout_rows(resumed)] == order
    assert [row["completion"] for row in rollout_rows(resumed)] == [row["completion"] for row in rollout_rows(straight)]
    a, b = policy_weights(straight / "checkpoints/last.ckpt"), policy_weights(resumed / "checkpoints/last.ckpt")
    assert all(torch.equal(a[k], b[k]) for k in a), "an exact resume ends bit-identical"


def test_sigterm_saves_a_checkpoint_and_stops_cleanly(tmp_path, monkeypatch, capsys):
    from rlcode.callbacks.metrics import StepMetrics

    original = StepMetrics.on_train_batch_end

    def signal_after_first_step(self, trainer, *args):
        original(self, trainer, *args)
        if trainer.global_step == 1:
            signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(StepMetrics, "on_train_batch_end", signal_after_first_step)
    run = fit(tmp_path, "--trainer.max_steps", "5", "--checkpoint.every_n_train_steps", "0")
    checkpoint = torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == 1
    assert not (run / "eval/step_1.json").exists()  # no final eval after an interruption
    out = capsys.readouterr().out
    assert "stopped by SIGTERM at step 1 of 5" in out and "Training complete!" not in out
    assert "Training stopped at step 1 of 5." in out and "  resume:     rlcode fit --config " in out
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt"]
    assert signal.getsignal(signal.SIGTERM) is not None  # handlers restored, not left pointing at the run


def test_last_checkpoint_is_the_final_state_when_max_steps_is_not_a_multiple_of_the_interval(tmp_path):
    """Lightning linked last.ckpt to the last numbered checkpoint (step 2), losing step 3's update."""
    run = fit(tmp_path, "--trainer.max_steps", "3", "--checkpoint.every_n_train_steps", "2",
              "--eval.at_start", "false", "--eval.at_end", "false")
    last = run / "checkpoints/last.ckpt"
    assert last.is_symlink() and last.resolve().name == "step-3.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 3


def test_resuming_a_finished_run_changes_nothing(tmp_path, capsys):
    """It had rewritten metrics.csv, the plot and the summary without the final eval (the summary then
    said 0.00 at step 0). Now it says so in one line and exits 0 (a requeued job of a finished run)."""
    run = fit(tmp_path, "--trainer.max_steps", "2")
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    fit(tmp_path, "--trainer.max_steps", "2", "--ckpt_path", "last")
    out = capsys.readouterr().out
    assert "already finished (step 2 of --trainer.max_steps 2): nothing to resume, nothing changed" in out, out
    assert "Step " not in out and "eval at step" not in out, out
    assert {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    assert len(list((tmp_path / "tiny").glob("version_*"))) == 1


def test_the_start_eval_runs_at_the_first_start_only(tmp_path):
    """eval.at_start is the baseline before step 1: a resume at step 2 ran it again (an extra MBPP
    eval per requeue). The eval due at the resumed step still runs (none is due here)."""
    quiet = ["--eval.at_end", "false", "--eval.every_n_steps", "0"]
    run = fit(tmp_path, "--trainer.max_steps", "2", *quiet)
    fit(tmp_path, "--trainer.max_steps", "3", "--ckpt_path", "last", *quiet)
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["step_0.json"]


def test_only_the_newest_three_numbered_checkpoints_are_kept_by_default(tmp_path):
    """Every numbered checkpoint was kept (checkpoint.keep was -1): ~1.2 TB for a 4B model's run."""
    run = fit(tmp_path, "--trainer.max_steps", "5", "--eval.at_start", "false", "--eval.at_end", "false")
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step-3.ckpt", "step-4.ckpt", "step-5.ckpt"], names
    assert (run / "checkpoints/last.ckpt").resolve().name == "step-5.ckpt"


def test_filtered_zero_variance_groups_leave_the_weights_alone(tmp_path, capsys):
    run = fit(tmp_path, "--model.mode.rewards", "[execution]", "--model.skip_zero_advantage_rows", "true",
              "--eval.at_start", "false", "--eval.at_end", "false")
    rows = rollout_rows(run)
    assert {row["reward"] for row in rows} == {-0.5}  # every completion of the random model is a syntax error
    assert capsys.readouterr().out.count("(no update)") == 2  # nothing left to learn from, yet max_steps ends it
    with (run / "metrics.csv").open() as handle:
        steps = [r for r in csv.DictReader(handle) if r.get("reward/avg_batch_reward")]
    assert len(steps) == 2 and not any(r.get("loss/loss") or r.get("train/grad_norm") for r in steps)
    trained, start = policy_weights(run / "checkpoints/last.ckpt"), initial_weights()
    assert all(torch.equal(trained[k], start[k]) for k in start)


def test_unknown_reward_is_a_one_line_error(tmp_path):
    with pytest.raises(SystemExit, match="^rlcode: unknown reward 'nope' in model.mode.init_args.rewards"):
        fit(tmp_path, "--model.mode.rewards", "[nope]")


def test_validate_and_test_report_the_greedy_pass_rate(tmp_path, monkeypatch, capsys):
    """The greedy pass rate counts passing programs: the 'model' answers the first two problems with
    MBPP's reference solutions and the third with a wrong one, so the rate must be 2/3 (a judge that
    failed everything, or passed everything, would not give it). Each eval batch prints a progress line."""
    import dataclasses

    from rlcode.data.mbpp import load_mbpp
    from rlcode.training.learner import Learner

    tasks = []  # the first three problems of the split being scored
    original_generate = Learner.generate

    def answer_with_references(self, prompts, num_generations, **kwargs):
        rollout = original_generate(self, prompts, num_generations, **kwargs)
        texts = []
        for prompt in prompts:
            task = next(t for t in tasks if t.test_list[0].strip() in prompt)
            right = task.task_id != tasks[2].task_id
            texts.append(f"```python\n{task.code if right else 'def nothing(): pass'}\n```")
        return dataclasses.replace(rollout, completion_texts=texts)

    monkeypatch.setattr(Learner, "generate", answer_with_references)
    for subcommand, prefix, split in (("validate", "mbpp_eval", "validation"), ("test", "mbpp_test", "test")):
        tasks[:] = load_mbpp(os.environ["MBPP_DATASET_PATH"], split=split)[:3]
        root = tmp_path / subcommand
        main([subcommand, *BASE, "--run.root_dir", str(root), "--data.num_eval_tasks", "3",
              "--data.eval_batch_size", "2"])
        with next(root.glob("tiny/version_*/metrics.csv")).open() as handle:
            row = next(csv.DictReader(handle))
        # a ratio of counts logged from float32: within u = 2^-24 (relative) of 2/3, well inside rel 1e-6
        assert float(row[f"{prefix}/pass_rate"]) == pytest.approx(2 / 3, rel=1e-6)
        assert float(row[f"{prefix}/problems_passed"]) == 2.0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"  MBPP {subcommand}:")]
        assert [line.split(", ")[0] for line in lines] == [f"  MBPP {subcommand}: 2/3 problems",
                                                           f"  MBPP {subcommand}: 3/3 problems"]
        assert lines[-1].split(", ")[1] == "pass rate 0.667 (2/3)"


@pytest.mark.parametrize("adapter", ["full", "lora"])
def test_kl_to_the_reference_policy(tmp_path, adapter):
    """beta > 0: a frozen copy (full fine-tuning) or the adapter-free base (LoRA) is the reference."""
    extra = ["--model.lora", "{r: 4, alpha: 8, dropout: 0.0}"] if adapter == "lora" else []
    run = fit(tmp_path, "--model.beta", "0.04", "--model.learning_rate", "1e-3",
              "--eval.at_start", "false", "--eval.at_end", "false", *extra)
    with (run / "metrics.csv").open() as handle:
        kls = [float(r["loss/kl"]) for r in csv.DictReader(handle) if r.get("loss/kl")]
    # Step 0: policy == reference, so per token d = ref - logp is only the two passes' float32
    # rounding (|d| <= 1e-3, the shared-prefix test's derived log-prob bound) and k3 = e^d - d - 1
    # <= d^2 / 2 + 3 u (its float32 evaluation near 0; u = 2^-24): at most 6.8e-7.
    assert len(kls) == 2 and kls[0] == pytest.approx(0.0, abs=1e-6)
    # After an update the policy has left the reference; a reference that followed the policy (a
    # shared module, adapters not switched off) would still read 0.
    assert kls[1] > 1e-6  # above that bound
    state = policy_weights(run / "checkpoints/last.ckpt")
    assert not any("_reference" in key for key in state), "the reference copy must not be checkpointed"
    if adapter == "lora":
        assert state and all("lora_" in key for key in state), "LoRA checkpoints hold the adapters only"
