"""The run history: what the module keeps of each step, and callbacks that show the same in any order.

The summary, the metrics, the plot and the eval files of a tiny CPU run (fixed rollouts, the real
sandbox for the eval) come out the same with the callbacks in one order and in the reverse one.
They used to find each other by scanning the trainer's callbacks, and the CLI had to list them in
one order (the banner before the first eval, the eval before metrics and plots).
"""

from __future__ import annotations

import csv
import json
import re
import signal
from pathlib import Path

import pytest

import torch
from lightning.pytorch.loggers import CSVLogger

from grpo_harness import build_module, fit_steps
from rlcode.callbacks import (GameEval, GracefulShutdown, MBPPEval, RolloutLogging, RunSummary, StepMetrics,
                              TrainingPlots, plots)
from rlcode.training.run_history import RunHistory
from rlcode.training.step_record import StepRecord


def record(step: int, rewards: list[float], **overrides) -> StepRecord:
    fields = dict(step=step, group_size=2, task_ids=[1, 2], prompts=["p1", "p2"], completions=["a", "b", "c", "d"],
                  rewards=rewards, rewards_by_function={"execution": rewards},
                  details=["ok"] * 4, advantages=[0.0] * 4, completion_lengths=[1, 2, 3, 4], truncated=[False] * 4,
                  frac_reward_zero_std=0.0, updated=True, loss={"loss": 0.5},
                  reward_metrics={"execution/successful_predictions_count": float(sum(r > 0 for r in rewards))},
                  timings={"step": 1.0})
    return StepRecord(**{**fields, **overrides})


def test_history_keeps_scalars_of_every_step_and_only_the_last_record():
    history = RunHistory()
    history.add_step(record(0, [1.0, 0.0, 0.0, 0.0]), grad_norm=2.5)
    history.add_step(record(1, [1.0, 1.0, 1.0, 0.0], updated=False), grad_norm=2.5)
    assert history.last_step.step == 1  # the one record kept whole
    assert history.rewards() == [(0, 0.25), (1, 0.75)]  # quarters: exact in binary
    assert history.steps[0].metrics["train/grad_norm"] == 2.5
    assert "train/grad_norm" not in history.steps[1].metrics  # no update: no gradient to report
    assert history.trajectories() == 8 and history.updates() == 1
    ran = history.successes({"execution": ("ran", "programs that ran without an error")})
    assert [(c.label, c.meaning, c.count, c.total) for c in ran] == [("ran", "programs that ran without an error", 4, 8)]


def test_history_survives_a_checkpoint_loaded_weights_only(tmp_path):
    """Checkpoints load with torch's weights_only unpickler: the history must be plain data."""
    history = RunHistory()
    history.add_step(record(0, [1.0, 0.0, 0.0, 0.0]))
    history.add_eval({"step": 0, "pass_rate": 0.5, "num_questions": 2, "path": None})
    torch.save({"run_history": history.state_dict()}, tmp_path / "x.ckpt")
    restored = RunHistory()
    restored.load_state_dict(torch.load(tmp_path / "x.ckpt", weights_only=True)["run_history"])
    assert restored.steps == history.steps and restored.evals == history.evals
    assert restored.last_step is None  # the completions' text is not kept in checkpoints


def _run(root: Path, reverse: bool, monkeypatch, capsys, sigterm_in_step: int | None = None) -> dict:
    """Three steps with an eval at start, after step 2 (a batch end) and at the end (train end); what
    every callback left. ``sigterm_in_step``: SIGTERM arrives during that step (the run stops after it)."""
    drawn = []
    monkeypatch.setattr(plots, "draw", lambda rewards, evals, path: drawn.append((rewards, evals)) or path)
    summary = RunSummary(command=["fit"])
    callbacks = [summary, MBPPEval(num_questions=2, every_n_steps=2, batch_size=1), GameEval(), StepMetrics(),
                 TrainingPlots(), RolloutLogging(), GracefulShutdown()]
    logger = CSVLogger(root, name="run")
    module = build_module()
    if sigterm_in_step is not None:
        step = module.training_step

        def training_step(batch, batch_idx):
            step(batch, batch_idx)
            if batch_idx == sigterm_in_step:
                signal.raise_signal(signal.SIGTERM)  # before any batch-end hook: the same for every order

        module.training_step = training_step
    fit_steps(module, steps=3, callbacks=callbacks[::-1] if reverse else callbacks, logger=logger)
    out = capsys.readouterr().out
    run = Path(logger.log_dir)
    with (run / "metrics.csv").open() as handle:  # timings and speeds differ from run to run
        rows = [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in csv.DictReader(handle)]
    # The same rows; the file lists them as they were logged (an eval's row after step 0 is keyed
    # by the step it ran at, 1, so which callback wrote first orders the file, not the content).
    rows.sort(key=lambda row: (int(row["step"]), json.dumps(row, sort_keys=True)))
    shown = {
        "summary": re.sub(r" in \d+(m\d+)?s", " in <time>", summary.text),
        "metrics": rows,
        "plot": drawn[-1],
        "evals": {path.name: json.loads(path.read_text()) for path in sorted((run / "eval").glob("*.json"))},
        "rollouts": (run / "rollouts.jsonl").read_text(),
        "banner_first": out.index("rlcode GRPO") < out.index("MBPP eval at step 0 (validation): 1/2"),
        "step_lines": re.findall(r"  Step \d+: reward=[^,]+", out),
    }
    return json.loads(json.dumps(shown).replace(str(root), "<root>"))  # each run has its own folder


def test_callbacks_show_the_same_in_any_order(tmp_path, monkeypatch, capsys):
    forward = _run(tmp_path / "forward", False, monkeypatch, capsys)
    backward = _run(tmp_path / "backward", True, monkeypatch, capsys)
    assert forward["banner_first"] and backward["banner_first"]
    assert [name for name in forward["evals"]] == ["step_0.json", "step_2.json", "step_3.json"]
    rewards, evals = forward["plot"]
    assert [step for step, _ in rewards] == [0, 1, 2] and [e["step"] for e in evals] == [0, 2, 3]
    assert "MBPP pass rate (2 problems)" in forward["summary"] and "plot:" in forward["summary"]
    assert len(forward["step_lines"]) == 3 and len([r for r in forward["metrics"] if r["reward/avg_batch_reward"]]) == 3
    for key in forward:
        assert forward[key] == backward[key], key


@pytest.mark.parametrize("stopped_in", [0, 1])
def test_an_interrupted_run_shows_the_same_in_any_order(tmp_path, monkeypatch, capsys, stopped_in):
    """The shutdown says at a batch end that the run stops; the evals skip their interval and final
    ones and the summary says where it stopped, whichever of them comes first."""
    forward = _run(tmp_path / "forward", False, monkeypatch, capsys, sigterm_in_step=stopped_in)
    backward = _run(tmp_path / "backward", True, monkeypatch, capsys, sigterm_in_step=stopped_in)
    assert f"stopped by SIGTERM at step {stopped_in + 1} of 3" in forward["summary"]
    assert "checkpoint: <root>/run/version_0/checkpoints/last.ckpt" in forward["summary"]
    # Step 2's interval eval (due after step index 1) is not run on the way out: the save comes
    # first, and a resumed run evaluates at step 2 before its first step.
    assert [e["step"] for e in forward["plot"][1]] == [0]
    for key in forward:
        assert forward[key] == backward[key], key


def test_a_resumed_run_keeps_the_history_before_its_checkpoint(tmp_path):
    """The summary and plot of a resumed run cover the steps before the interruption: the module
    saves its history in the checkpoint (callbacks used to keep their own, each in its own state)."""
    first = build_module()
    trainer = fit_steps(first, steps=2)
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    first.history.add_eval({"step": 2, "pass_rate": 0.5})  # after the save: not in the checkpoint
    resumed = build_module()
    fit_steps(resumed, steps=3, ckpt_path=tmp_path / "last.ckpt")
    assert resumed.history.rewards()[:2] == first.history.rewards()
    assert [s.step for s in resumed.history.steps] == [0, 1, 2] and resumed.history.evals == []
    assert resumed.history.trajectories() == 3 * 2 * 4  # 3 steps of 2 prompts x 4 completions
