"""Callbacks on hand-made step records: metric names, rollout samples, plots, summary, signals, eval config."""

from __future__ import annotations

import json
import math
import signal
from types import SimpleNamespace

import pytest

from rlcode.callbacks.mbpp_eval import NUM_QUESTIONS_ENV, MBPPEval
from rlcode.callbacks.metrics import step_line, step_metrics, success_counts, successes
from rlcode.callbacks.plots import draw
from rlcode.callbacks.rollout_logging import RolloutLogging, sample_rows
from rlcode.callbacks.shutdown import GracefulShutdown
from rlcode.callbacks.summary import summarize
from rlcode.stopping import StopPoint, StopToken
from rlcode.training.all_ranks_totals import Ranks
from rlcode.training.run_history import RunDescription, RunHistory
from rlcode.training.step_record import StepRecord


def record(**overrides) -> StepRecord:
    fields = dict(
        step=3, group_size=2, task_ids=[601, 602], prompts=["p1", "p2"],
        completions=["a1", "a2", "b1", "b2"], rewards=[1.0, -0.5, 0.5, float("nan")],
        rewards_by_function={"execution": [1.0, -0.5, 0.5, float("nan")]},
        details=["ok", "syntax_error", "ok", "timeout"], advantages=[0.7, -0.7, 0.0, 0.0],
        completion_lengths=[10, 20, 30, 40], truncated=[False, False, True, True], frac_reward_zero_std=0.5,
        updated=True, loss={"loss": 0.1, "clip_frac_region": 0.0},
        reward_metrics={"execution/successful_predictions_count": 2.0},
        timings={"step": 2.0, "generation": 1.5},
    )
    fields.update(overrides)
    return StepRecord(**fields)


def test_step_metrics_carry_the_seed_names_and_ignore_nan():
    metrics = step_metrics(record())
    assert metrics["reward/avg_batch_reward"] == pytest.approx(1.0 / 3)
    assert metrics["reward/execution"] == pytest.approx(1.0 / 3)
    assert metrics["reward/successful_predictions_count"] == 2.0
    assert metrics["completions/mean_length"] == 25.0 and metrics["completions/truncated_fraction"] == 0.5
    assert metrics["perf/tokens_per_s"] == 50.0  # 100 tokens in 2 s
    assert metrics["loss/clip_frac_region"] == 0.0 and metrics["perf/generation_s"] == 1.5
    assert metrics["reward/frac_reward_zero_std"] == 0.5


def test_success_count_falls_back_to_positive_rewards():
    assert successes(record(reward_metrics={})) == 2
    line = step_line(record(updated=False, reward_metrics={}))
    assert line.startswith("  Step 3: reward=0.333, positive=50.0% (2/4), time=") and line.endswith("(no update)")


def test_each_success_count_is_named_by_what_it_counts_per_reward():
    """"success" used to be the first reward's count whatever it was: under the execution reward it
    counted programs that ran, shown beside the eval's pass rate as if tests had passed."""
    both = record(rewards_by_function={"execution": [1.0, -0.5, 0.5, 0.5], "mbpp_tests_fraction": [1.0, 0, 0, 0.5],
                                       "mbpp_tests": [1.0, 0, 0, 0]},
                  reward_metrics={"execution/successful_predictions_count": 3.0,
                                  "mbpp_tests_fraction/successful_predictions_count": 1.0,
                                  "mbpp_tests/successful_predictions_count": 1.0})
    counts = success_counts(both)
    assert [(c.label, c.count, c.total) for c in counts] == [("ran", 3, 4), ("passed", 1, 4)]
    assert counts[0].meaning == "programs that ran without an error"
    assert counts[1].meaning == "programs that passed every MBPP test"
    assert "reward=0.333, ran=75.0% (3/4), passed=25.0% (1/4), time=2.0s" in step_line(both)
    assert step_metrics(both)["reward/successful_predictions_count"] == 3.0  # the W&B key keeps its meaning


def test_rollout_samples_show_every_prompt_first(tmp_path):
    rows = sample_rows(record(), 3)
    assert [(r["task_id"], r["completion"]) for r in rows] == [(601, "a1"), (602, "b1"), (601, "a2")]
    assert rows[2]["verdict"] == "syntax_error" and rows[0]["rewards"] == {"execution": 1.0}

    trainer = SimpleNamespace(log_dir=str(tmp_path), default_root_dir=str(tmp_path), is_global_zero=True,
                              loggers=[])
    callback = RolloutLogging(every_n_steps=1, samples_per_step=2)
    module = SimpleNamespace(history=RunHistory())
    module.history.add_step(record())
    callback.on_train_batch_end(trainer, module, None, None, 0)
    callback.on_train_batch_end(trainer, module, None, None, 1)
    lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 4 and json.loads(lines[0])["prompt"] == "p1"


def test_plot_is_written(tmp_path):
    path = draw([(0, -0.5), (1, 0.0), (2, 0.25)], [{"step": 0, "pass_rate": 0.2}, {"step": 2, "pass_rate": 0.4}],
                tmp_path / "plots" / "training.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_summary_reports_change_and_files():
    text = summarize(steps=6, seconds=125, rewards=[(i, float(i)) for i in range(6)],
                     evals=[{"step": 0, "pass_rate": 0.25, "num_questions": 4},
                            {"step": 6, "pass_rate": 0.5, "num_questions": 4, "path": "runs/x/eval/step_6.json"}],
                     run="runs/x/version_0", checkpoint="runs/x/version_0/checkpoints/last.ckpt",
                     plot="runs/x/version_0/plots/training.png")
    assert text.startswith("rlcode fit finished: 6 optimizer steps in 2m05s")
    assert "first 3 step(s) +1.000 -> last 3 step(s) +4.000" in text
    assert "0.25 at step 0 -> 0.50 at step 6" in text
    for expected in ("runs/x/version_0", "last.ckpt", "step_6.json", "training.png"):
        assert expected in text

    ran = [("programs that ran without an error", 7)]
    done = summarize(2, 1, [], [], "r", "r/last.ckpt", None, trajectories=8, successes=ran, max_steps=2, updates=2)
    assert "Training complete!\n  Total trajectories: 8\n  Programs that ran without an error: 7 (87.5%)\n" in done
    assert "steps (" not in done and "resume" not in done


def test_an_interrupted_run_says_where_it_stopped_and_how_to_resume():
    from rlcode.callbacks.summary import resume_command

    command = resume_command(["fit", "--config", "configs/my run.yaml", "--ckpt_path", "old.ckpt"])
    assert command == "rlcode fit --config 'configs/my run.yaml' --ckpt_path last"
    text = summarize(3, 1, [], [], "r", "r/last.ckpt", None, interrupted="SIGINT", trajectories=24,
                     max_steps=6, resume=command)
    assert text.startswith("rlcode fit stopped by SIGINT at step 3 of 6 in 1s")
    assert f"  resume:     {command}" in text
    assert "Training complete!" not in text and "Training stopped at step 3 of 6." in text
    assert resume_command({"fit": {}}) is None  # arguments given as a dict: no command line to repeat


def test_a_dry_run_says_it_made_no_updates_and_names_no_checkpoint():
    text = summarize(2, 1, [], [], "r", None, None, trajectories=8, max_steps=2, dry_run=True, updates=0)
    assert text.startswith("rlcode fit (dry run) finished 2 steps in 1s: rollouts and rewards only, no weight "
                           "updates, no checkpoint")
    assert "optimizer steps" not in text and "Training complete!" not in text and "checkpoint:" not in text
    assert "Dry run complete: no weight updates." in text


def test_steps_without_an_update_are_not_called_optimizer_steps():
    assert "finished: 6 steps (4 updated the weights) in" in summarize(6, 1, [], [], "r", None, None, updates=4)


def test_graceful_shutdown_turns_a_signal_into_a_checkpoint_and_a_stop(tmp_path):
    saved = []
    module = SimpleNamespace(history=RunHistory(), run_description=lambda: RunDescription("GRPO", "model", []),
                             stop_token=StopToken(), ranks=Ranks)
    trainer = SimpleNamespace(checkpoint_callback=SimpleNamespace(dirpath=str(tmp_path)), log_dir=str(tmp_path),
                              lightning_module=module, global_step=7, should_stop=False,
                              save_checkpoint=saved.append)
    callback = GracefulShutdown()
    before = signal.getsignal(signal.SIGINT)
    callback.setup(trainer, module, "fit")
    try:
        callback.on_train_batch_end(trainer, module, None, None, 0)
        assert not trainer.should_stop and not saved  # nothing happens without a signal
        signal.raise_signal(signal.SIGINT)  # would be a KeyboardInterrupt without the callback
        assert module.stop_token.signal == "SIGINT" and module.stop_token.requested()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a second Ctrl-C acts at once
        callback.on_train_batch_end(trainer, module, None, None, 1)
        assert trainer.should_stop and saved == [f"{tmp_path}/last.ckpt"]
        # what the evals (no final one) and the summary read
        assert (module.history.stopped_by, module.history.saved_on_stop) == ("SIGINT", f"{tmp_path}/last.ckpt")
        assert module.stop_token.asks == {StopPoint.STEP_END: 2}
    finally:
        callback.teardown(trainer, None, "fit")  # after the final eval, which a signal may abandon too
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_sigterm_stops_at_once_even_under_a_logging_handler():
    """Lightning installs a SIGTERM handler that only logs; restoring it after the first SIGTERM
    made "send it again to stop at once" false (seen: a run kept going to its next checkpoint)."""
    logged = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: logged.append(signum))  # Lightning's stand-in
    callback = GracefulShutdown()
    trainer = SimpleNamespace()
    try:
        callback.on_train_start(trainer, None)
        signal.raise_signal(signal.SIGTERM)
        assert callback.token.signal == "SIGTERM" and not logged
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the next SIGTERM terminates
        callback.teardown(trainer, None, "fit")
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # the run's end puts back the one found
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_eval_question_count_comes_from_the_environment(monkeypatch):
    callback = MBPPEval(num_questions=5)
    monkeypatch.delenv(NUM_QUESTIONS_ENV, raising=False)
    assert callback.effective_num_questions == 5
    monkeypatch.setenv(NUM_QUESTIONS_ENV, "2")
    assert callback.effective_num_questions == 2
    monkeypatch.setenv(NUM_QUESTIONS_ENV, "two")
    with pytest.raises(ValueError, match=NUM_QUESTIONS_ENV):
        _ = callback.effective_num_questions


def test_eval_schedule(monkeypatch):
    callback = MBPPEval(every_n_steps=2, at_start=True, at_end=True)
    calls = []
    monkeypatch.setattr(callback, "evaluate", lambda trainer, module: calls.append(trainer.global_step)
                        or callback.__setattr__("_last_step", trainer.global_step))
    trainer = SimpleNamespace(global_step=0, callbacks=[callback])
    module = SimpleNamespace(history=RunHistory())
    callback.on_train_start(trainer, module)
    for step in (1, 2, 3):
        trainer.global_step = step
        callback.on_train_batch_end(trainer, module, None, None, step)
    callback.on_train_end(trainer, module)
    assert calls == [0, 2, 3]
    trainer.global_step = 4
    callback.on_train_batch_end(trainer, module, None, None, 4)
    callback.on_train_end(trainer, module)  # the final eval is not repeated at the same step
    assert calls == [0, 2, 3, 4]


def test_nan_rewards_do_not_poison_the_mean():
    assert math.isclose(record().mean_reward, 1.0 / 3)


def test_banner_says_what_will_happen():
    from rlcode.callbacks.summary import banner

    text = banner("smollm2-135m-instruct", 4, 2, 6, 2, 8, ["execution", "mbpp_tests_fraction"], "runs/q/version_0",
                  dry_run=True)
    assert "dry run" in text and "Problems: 4 train, 2 eval" in text and "2 prompts x 8 generations" in text
    assert "Rewards: execution + mbpp_tests_fraction" in text
