"""Stand-ins for ``tests/test_stop_signals.py``: a slow eval, a slow save and a signal sent at a chosen
point, and a log of when things happened (``events.jsonl`` in the run's root, monotonic seconds).

Run as ``python tests/stop_stand_ins.py ROOT WHEN SIGNAL [rlcode fit arguments]``; ``WHEN`` is
``eval-batch@<n>`` (as the eval's batch n begins: n counts every eval batch of the process),
``step@<n>`` (during training step n, from the reward function) or ``save@<n>`` (as the checkpoint of
step n begins to be written), or ``none``.

Each eval batch takes ``BATCH_SECONDS`` (the completions and the verdicts are fixed, so the time is
the sleep's) and each save ``SAVE_SECONDS`` more than the tiny model's real save.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

BATCH_SECONDS = 3.0
SAVE_SECONDS = 3.0
_state = {"batches": 0, "log": None, "when": "none", "signal": "SIGTERM"}


def event(name: str, **fields) -> None:
    with open(_state["log"], "a") as handle:
        handle.write(json.dumps({"event": name, "t": time.monotonic(), **fields}) + "\n")


def read_events(root: Path) -> list[dict]:
    return [json.loads(line) for line in (root / "events.jsonl").read_text().splitlines()]


def _send_if(point: str) -> None:
    if _state["when"] == point:
        event("signal", at=point)
        os.kill(os.getpid(), getattr(signal, _state["signal"]))


def reward_sending_the_signal(prompts, completions, step=None, **columns) -> list[float]:
    """A length reward that sends the signal while training step ``step`` runs."""
    event("step", step=step)
    _send_if(f"step@{step}")
    return [len(text) / 100.0 for text in completions]


def _install() -> None:
    from rlcode.callbacks import checkpointing
    from rlcode.callbacks.checkpointing import StepCheckpoint
    from rlcode.eval import policy_scoring

    def slow_generate(module, prompts, per_prompt, *args, **kwargs):
        number = _state["batches"]
        _state["batches"] += 1
        event("eval_batch", number=number, step=module.global_step)
        _send_if(f"eval-batch@{number}")
        time.sleep(BATCH_SECONDS)
        return ["    return None"] * (len(prompts) * per_prompt)

    def fixed_verdicts(pool, problems, completions, per_task, timeout):
        return [SimpleNamespace(all_passed=False, passed=[False], reason="stand-in") for _ in completions]

    policy_scoring._generate = slow_generate
    policy_scoring._check_all = fixed_verdicts

    original_save = StepCheckpoint._save_checkpoint

    def slow_save(self, trainer, filepath):
        event("save_start", step=trainer.global_step, path=Path(filepath).name)
        _send_if(f"save@{trainer.global_step}")
        time.sleep(SAVE_SECONDS)
        original_save(self, trainer, filepath)
        event("save_end", step=trainer.global_step, path=Path(filepath).name)

    StepCheckpoint._save_checkpoint = slow_save

    original_save_last = checkpointing._save_last  # called once per stop, first thing (save_and_stop)

    def stop(trainer):
        event("stop", step=trainer.global_step)
        return original_save_last(trainer)

    checkpointing._save_last = stop


if __name__ == "__main__":
    sys.modules["stop_stand_ins"] = sys.modules["__main__"]  # the reward, imported by name, shares _state
    root, _state["when"], _state["signal"] = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    root.mkdir(parents=True, exist_ok=True)
    _state["log"] = root / "events.jsonl"
    atexit.register(lambda: event("exit"))
    _install()
    from rlcode.cli.command import main

    main(sys.argv[4:])
