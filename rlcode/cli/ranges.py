"""The allowed range of every numeric setting a user can get wrong, checked on the parsed config
before anything is built (no model, no trainer, no run directory).

A negative learning rate or ``max_new_tokens: 0`` otherwise surfaces deep inside a step or an eval,
as a traceback after minutes, with a partial run directory left behind. One table here, checked in
one pass by ``rlcode.cli.prechecks``: ``rlcode: model.learning_rate=-1e-05 is out of range: use a
number > 0 (on the command line)``. Keys are written as on the command line (``model.mode.X`` for a
mode's settings, ``data.X`` for the DataModule's); a key a config's classes do not have is skipped,
and so is a value of None (the documented "off" or "default" of the optional ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlcode.cli.errors import UserError, locate


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (None: unbounded), each end included unless ``*_open``,
    plus the special values in ``also`` (e.g. -1: no limit)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    also: tuple = ()
    also_meaning: str = ""

    def allows(self, value) -> bool:
        if value in self.also:
            return True
        if isinstance(value, float) and math.isnan(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            text = f"{kind} in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}" \
                   f"{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_num(self.low)}"
        else:
            text = f"{kind} {'<' if self.high_open else '<='} {_num(self.high)}"
        extra = ", ".join(str(v) for v in self.also)
        return f"{text}, or {extra}{f' ({self.also_meaning})' if self.also_meaning else ''}" if extra else text


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
COUNT = Range(1, integer=True)  # a number of things that must exist: at least one
COUNT_OR_ZERO = Range(0, integer=True)  # 0 documented as "off" / "only at start and end"
PROBABILITY = Range(0, 1)
SEED = Range(0, integer=True)  # numpy's generators refuse negative seeds

RANGES: dict[str, Range] = {
    # The Learner: sampling, loss and update.
    "model.learning_rate": POSITIVE,
    "model.weight_decay": NON_NEGATIVE,
    "model.max_new_tokens": COUNT,
    "model.temperature": POSITIVE,  # it also divides the logits that score the tokens: 0 cannot train
    "model.top_p": Range(0, 1, low_open=True),
    "model.top_k": COUNT_OR_ZERO,
    "model.generation_seed": SEED,
    "model.beta": NON_NEGATIVE,
    "model.epsilon_low": Range(0, 1, high_open=True),  # the ratio's lower clip is 1 - epsilon_low
    "model.epsilon_high": NON_NEGATIVE,
    "model.num_iterations": COUNT,
    "model.micro_batch_size": COUNT,
    "model.micro_batch_tokens": COUNT,
    "model.max_grad_norm": POSITIVE,
    "model.lora.r": COUNT,
    "model.lora.alpha": COUNT,
    "model.lora.dropout": Range(0, 1, high_open=True),
    # The modes' settings.
    "model.mode.num_generations": COUNT,
    "model.mode.reward_timeout": POSITIVE,
    "model.mode.program_timeout": POSITIVE,
    "model.mode.max_attempts": COUNT,
    "model.mode.attempt_discount": PROBABILITY,
    "model.mode.max_turns": COUNT,
    "model.mode.predictions_per_program": COUNT,
    "model.mode.rae_decay": PROBABILITY,
    "model.mode.eval_temperature": NON_NEGATIVE,  # 0: greedy
    "model.mode.opponent_temperature": NON_NEGATIVE,  # 0: greedy
    "model.mode.opponent_max_new_tokens": COUNT,
    "model.mode.sandbox.workers": COUNT,
    "model.mode.dynamic_sampling.max_extra_rounds": COUNT,
    # The DataModules.
    "data.num_train_tasks": COUNT,
    "data.prompts_per_step": COUNT,
    "data.num_eval_tasks": COUNT,
    "data.eval_batch_size": COUNT,
    "data.seed": SEED,
    "data.episodes_per_step": COUNT,
    "data.eval_episodes": COUNT,
    "data.eval_seed": SEED,
    # Evaluation, logging and checkpoints during fit.
    "eval.num_questions": COUNT,
    "eval.every_n_steps": COUNT_OR_ZERO,
    "eval.num_samples": COUNT_OR_ZERO,
    "eval.k": COUNT,
    "eval.temperature": NON_NEGATIVE,
    "eval.max_new_tokens": COUNT,
    "eval.timeout": POSITIVE,
    "eval.batch_size": COUNT,
    "eval.sandbox_workers": COUNT,
    "game_eval.every_n_steps": COUNT_OR_ZERO,
    "rollout_log.every_n_steps": COUNT_OR_ZERO,
    "rollout_log.samples_per_step": COUNT_OR_ZERO,
    "checkpoint.every_n_train_steps": COUNT_OR_ZERO,
    "checkpoint.keep": Range(1, integer=True, also=(-1,), also_meaning="all"),
    # The trainer and the run.
    "trainer.max_steps": Range(1, integer=True, also=(-1,), also_meaning="no limit"),
    "run.cpu_threads": COUNT,
}


def check_ranges(config, argv: list[str]) -> None:
    """Raise a one-line ``UserError`` for the first setting of ``RANGES`` outside its range."""
    for key, allowed in RANGES.items():
        value = value_at(config, key)
        values = value if isinstance(value, (list, tuple)) else [value]  # eval.k: each one
        for item in values:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and not allowed.allows(item):
                where = locate(key.split("."), argv) or "in a config"
                raise UserError(f"{key}={item!r} is out of range: use {allowed.describe()} ({where})")


def value_at(config, dotted: str):
    """The parsed value at ``model.mode.num_generations`` (through a subclass's ``init_args``), or None."""
    node = config
    for part in dotted.split("."):
        node = _settings_of(node)
        if node is None:
            return None
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return node


def _settings_of(node):
    """A class given as ``{class_path, init_args}``: its settings; plain settings as they are."""
    if node is None:
        return None
    getter = node.get if hasattr(node, "get") else lambda key, default=None: getattr(node, key, default)
    if getter("class_path") is not None and getter("init_args") is not None:
        return getter("init_args")
    return node

