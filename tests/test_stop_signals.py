"""A stop signal is acted on within one eval batch wherever it lands, and the save comes first.

The runs are ``rlcode fit`` processes on the tiny stacks with the stand-ins of
``tests/stop_stand_ins.py``: every eval batch takes ``BATCH_SECONDS`` (fixed completions and
verdicts), every save ``SAVE_SECONDS`` more, and the signal is sent from inside the run at a chosen
point. The proof that an eval was abandoned is that no eval batch begins after the signal; the
latencies are bounded from the stand-ins' times, not tuned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stop_stand_ins import BATCH_SECONDS, SAVE_SECONDS, read_events

REPO = Path(__file__).resolve().parents[1]
DRIVER = Path(__file__).resolve().parent / "stop_stand_ins.py"


def fit(root: Path, when: str, signal_name: str, *extra: str, command: str = "fit") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    arguments = [command, "--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
                 "--config", str(REPO / "configs/tiny_grpo.yaml"), "--run.root_dir", str(root),
                 "--model.mode.rewards", "['stop_stand_ins:reward_sending_the_signal']",
                 "--model.mode.sandbox.workers", "1", "--eval.batch_size", "1", *extra]
    command = [sys.executable, str(DRIVER), str(root), when, signal_name, *arguments]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def first(events: list[dict], name: str) -> dict:
    return next(e for e in events if e["event"] == name)


def after_signal(events: list[dict], name: str) -> list[dict]:
    signalled = first(events, "signal")["t"]
    return [e for e in events if e["event"] == name and e["t"] > signalled]


def eval_files(run: Path) -> list[str]:
    return sorted(path.name for path in (run / "eval").glob("*.json"))


def saved_step(run: Path) -> int:
    return torch.load(run / "checkpoints/last.ckpt", map_location="cpu", weights_only=False)["global_step"]


@pytest.mark.slow
def test_sigterm_during_the_start_eval_stops_after_the_batch_in_flight(tmp_path):
    """Before, SIGTERM during the start-of-run eval went unheard (Lightning's handler only logged)
    and the eval ran to its end. At step 0 no step ran: there is nothing to save, and the summary says
    the run stopped at step 0."""
    done = fit(tmp_path, "eval-batch@1", "SIGTERM", "--eval.num_questions", "8", "--trainer.max_steps", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_events(tmp_path)
    assert not after_signal(events, "eval_batch"), "no eval batch begins after the signal"
    assert not [e for e in events if e["event"] == "step"], "no training step ran"
    # The batch in flight ends at most BATCH_SECONDS after the signal; a second batch would end at
    # 2 * BATCH_SECONDS at the earliest, so a stop before that is a stop at the batch boundary.
    assert first(events, "stop")["t"] - first(events, "signal")["t"] < 2 * BATCH_SECONDS
    # Then no save (step 0) and the summary: an allowance of one more batch time for the tiny run's
    # summary and loggers, where the rest of the eval would have taken 6 * BATCH_SECONDS.
    assert first(events, "exit")["t"] - first(events, "signal")["t"] < 3 * BATCH_SECONDS
    run = tmp_path / "tiny/version_0"
    assert eval_files(run) == [], "no eval file for the abandoned eval"
    assert not (run / "checkpoints/last.ckpt").exists()
    assert "no step ran, nothing to save" in done.stderr + done.stdout
    assert "stopped by SIGTERM at step 0 of 3" in done.stdout, done.stdout[-2000:]


@pytest.mark.slow
def test_sigint_in_a_step_with_the_interval_eval_due_saves_first_and_the_eval_runs_on_resume(tmp_path):
    """Before, the interval eval due after the interrupted step ran first and last.ckpt came after it."""
    setting = ["--eval.at_start", "false", "--eval.at_end", "false", "--eval.every_n_steps", "2",
               "--trainer.max_steps", "3", "--checkpoint.every_n_train_steps", "0"]
    stopped = fit(tmp_path, "step@1", "SIGINT", *setting)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    events, run = read_events(tmp_path), tmp_path / "tiny/version_0"
    assert not [e for e in events if e["event"] == "eval_batch"], "the eval due at step 2 did not start"
    # signalled before its update, step 1 is given up: the save holds step 0's end, step 1 is redone
    assert [e["step"] for e in events if e["event"] == "save_start"] == [1] and saved_step(run) == 1
    assert not (run / "eval/step_2.json").exists()
    assert "stopped by SIGINT at step 1 of 3" in stopped.stdout, stopped.stdout[-2000:]

    (tmp_path / "events.jsonl").unlink()
    resumed = fit(tmp_path, "none", "SIGINT", *setting, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    events = read_events(tmp_path)
    kinds = [(e["event"], e.get("step")) for e in events if e["event"] in ("eval_batch", "step")]
    assert kinds == [("step", 1), ("eval_batch", 2), ("eval_batch", 2), ("step", 2)], \
        "step 1 again, then step 2's eval, then step 2"
    assert (run / "eval/step_2.json").exists()


@pytest.mark.slow
def test_sigterm_during_the_interval_eval_saves_the_step_and_redoes_the_eval_on_resume(tmp_path):
    setting = ["--eval.at_start", "false", "--eval.at_end", "false", "--eval.every_n_steps", "1",
               "--eval.num_questions", "8", "--trainer.max_steps", "3", "--checkpoint.every_n_train_steps", "0"]
    stopped = fit(tmp_path, "eval-batch@1", "SIGTERM", *setting)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    events, run = read_events(tmp_path), tmp_path / "tiny/version_0"
    assert not after_signal(events, "eval_batch") and not after_signal(events, "step")
    # The batch in flight (at most BATCH_SECONDS), then the save (SAVE_SECONDS and the tiny model's
    # write); the rest of the eval (6 more batches) would have come before it.
    assert first(events, "save_start")["t"] - first(events, "signal")["t"] < 2 * BATCH_SECONDS
    assert saved_step(run) == 1 and eval_files(run) == []
    assert "abandoned" in stopped.stderr + stopped.stdout


@pytest.mark.slow
def test_a_signal_during_a_save_finishes_the_save_then_stops(tmp_path):
    """The numbered checkpoint of step 1 is being written when SIGTERM lands: the save completes and
    the run stops there, without another step (the shutdown had looked at this batch end already)."""
    done = fit(tmp_path, "save@1", "SIGTERM", "--eval.at_start", "false", "--eval.at_end", "false",
               "--eval.every_n_steps", "0", "--trainer.max_steps", "4", "--checkpoint.every_n_train_steps", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    events, run = read_events(tmp_path), tmp_path / "tiny/version_0"
    assert not after_signal(events, "step"), "no step after the signal"
    assert [e["step"] for e in events if e["event"] == "save_end"][:1] == [1]
    assert saved_step(run) == 1
    assert "stopped by SIGTERM at step 1 of 4" in done.stdout, done.stdout[-2000:]
    # The save in flight (SAVE_SECONDS and the tiny model's write), then the summary: within one
    # more SAVE_SECONDS, where a step and its save would take a further SAVE_SECONDS at least.
    assert first(events, "exit")["t"] - first(events, "signal")["t"] < 2 * SAVE_SECONDS + BATCH_SECONDS


@pytest.mark.slow
def test_sigterm_during_rlcode_validate_stops_after_the_batch_in_flight_with_one_line(tmp_path):
    done = fit(tmp_path, "eval-batch@1", "SIGTERM", "--data.eval_batch_size", "1", "--eval.num_questions", "6",
               command="validate")
    assert done.returncode == 0, done.stderr[-3000:]
    events = read_events(tmp_path)
    assert not after_signal(events, "eval_batch"), "no batch begins after the signal"
    # The batch in flight (at most BATCH_SECONDS), then the exit: within one more batch time, where
    # the 4 batches left would take 4 * BATCH_SECONDS.
    assert first(events, "exit")["t"] - first(events, "signal")["t"] < 2 * BATCH_SECONDS
    assert "rlcode validate stopped by SIGTERM after 2 batches; no results written" in done.stdout, done.stdout[-2000:]
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("eval/*.json")), "no verdict file for the unfinished validate"


# ---- the pieces, without a run ------------------------------------------------------------------

def test_the_scorer_stops_before_the_next_batch_and_returns_nothing(monkeypatch):
    from types import SimpleNamespace

    from rlcode.eval import policy_scoring

    generated = []
    monkeypatch.setattr(policy_scoring, "_generate", lambda module, prompts, *a, **k: generated.append(prompts) or
                        ["x"] * len(prompts))
    monkeypatch.setattr(policy_scoring, "_check_all", lambda pool, problems, completions, *a: [
        SimpleNamespace(all_passed=True, passed=[True]) for _ in completions])
    problems = [SimpleNamespace(task_id=i, test_list=["assert True"], test_setup_code="", entry_point=None)
                for i in range(4)]
    from rlcode.stopping import Stopped

    with pytest.raises(Stopped, match="after 2 of 4 problems"):
        policy_scoring.score_policy(None, ["p"] * 4, problems, None, step=0, split="v", max_new_tokens=4,
                                    timeout=1.0, batch_size=1, should_stop=lambda: len(generated) == 2)
    assert len(generated) == 2, "the third batch was never generated"


def test_a_game_eval_stops_between_games_records_nothing_and_asks_for_the_save(monkeypatch):
    from types import SimpleNamespace

    from rlcode.callbacks import GameEval
    from rlcode.callbacks import checkpointing
    from rlcode.stopping import StopPoint, StopToken
    from rlcode.training.all_ranks_totals import Ranks
    from rlcode.training.run_history import RunHistory

    token, played, stopped = StopToken(), [], []

    def play_against_random(module, batch, seed):
        played.append(batch)
        token.request("SIGTERM")  # the signal lands during the first game
        return []

    mode = SimpleNamespace(play_against_random=play_against_random, baselines=SimpleNamespace(values={}))
    module = SimpleNamespace(mode=mode, history=RunHistory(), stop_token=token, ranks=Ranks)
    trainer = SimpleNamespace(global_step=4, datamodule=SimpleNamespace(eval_batches=lambda: ["tictactoe", "kuhn"]))
    monkeypatch.setattr(checkpointing, "_save_last", lambda trainer: stopped.append(trainer.global_step))
    assert GameEval().evaluate(trainer, module) is None
    assert played == ["tictactoe"] and stopped == [4] and module.history.game_evals == []
    assert token.asks == {StopPoint.GAME: 2} and trainer.should_stop


def test_validate_stops_between_batches_with_a_one_line_message():
    from types import SimpleNamespace

    from rlcode.callbacks import GracefulShutdown
    from rlcode.stopping import Stopped, StopToken
    from rlcode.training.all_ranks_totals import Ranks

    trainer = SimpleNamespace(state=SimpleNamespace(fn="validate"))
    module = SimpleNamespace(stop_token=StopToken(), ranks=Ranks)
    shutdown = GracefulShutdown()
    shutdown.setup(trainer, module, "validate")
    try:
        shutdown.on_validation_batch_start(trainer, module, None, 0)  # no signal: nothing happens
        module.stop_token.request("SIGTERM")
        with pytest.raises(Stopped) as stopped:
            shutdown.on_validation_batch_start(trainer, module, None, 3)
    finally:
        shutdown.teardown(SimpleNamespace(is_global_zero=True), module, "validate")
    assert str(stopped.value) == ("validate stopped by SIGTERM after 3 batches; no results written "
                                  "(run it again to score the checkpoint)")
