"""Reading a samples file for ``rlcode-eval``: one JSON object per line, each good or bad on its own.

A bad line (malformed JSON, too deep, no task id or completion, a task id that names no task) is
kept as an error for its line number, never raised: one truncated line among thousands must not cost
the verdicts of the others. The command scores every good line, writes an error row for every bad
one, and exits 2 when any line was bad.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# Deepest input line read. A line the JSON decoder accepts may still be too deep for what follows
# (extracting its completion, writing its result line back), which would then fail half-way with a
# RecursionError; samples are ~3 levels deep.
MAX_INPUT_DEPTH = 100
# A task number: ASCII digits only (str.isdigit() also accepts "²" and "①", which int() refuses, and
# "١٧", which int() reads as 17), at most 9 of them (MBPP has 974 tasks, HumanEval 164).
TASK_NUMBER = re.compile(r"[0-9]{1,9}")
MAX_TASK_NUMBER = 10**9 - 1


@dataclass
class SampleLine:
    """One non-blank input line: ``raw`` and ``task_id`` when good, ``error`` when bad."""

    number: int  # 1-based line number in the file
    raw: dict | None = None
    task_id: int | None = None
    error: str | None = None


def read_sample_lines(path: Path) -> list[SampleLine]:
    """Every non-blank line of ``path``, in order; bad lines carry their error."""
    lines = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, start=1):
            if text.strip():
                lines.append(_parse(number, text))
    return lines


def _parse(number: int, text: str) -> SampleLine:
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        return SampleLine(number, error=f"malformed JSON line ({e.msg})")
    except RecursionError:  # the C decoder's own guard, at ~1000 levels
        return SampleLine(number, error="malformed JSON line (nested too deeply)")
    except ValueError as e:  # an integer beyond Python's digit limit for str -> int
        return SampleLine(number, error=f"malformed JSON line ({str(e).split(':')[0]})")
    if _deeper_than(raw, MAX_INPUT_DEPTH):
        return SampleLine(number, error=f"malformed JSON line (nested deeper than {MAX_INPUT_DEPTH} levels)")
    if not isinstance(raw, dict) or "task_id" not in raw or "completion" not in raw:
        return SampleLine(number, error='each line needs "task_id" and "completion"')
    task_id = task_number(raw["task_id"])
    if task_id is None:
        return SampleLine(number, error=f"task_id must be a task number, got {raw['task_id']!r:.40}")
    return SampleLine(number, raw=raw, task_id=task_id)


def task_number(value) -> int | None:
    """An int, or a string like "11", "Mbpp/11" or "HumanEval/0" (ASCII digits); None otherwise."""
    if type(value) is int:
        return value if 0 <= value <= MAX_TASK_NUMBER else None
    if isinstance(value, str):
        tail = value.rsplit("/", 1)[-1]
        if TASK_NUMBER.fullmatch(tail):
            return int(tail)
    return None


def _deeper_than(value, limit: int) -> bool:
    """Whether ``value``'s containers nest deeper than ``limit`` (iterative: no recursion to exhaust)."""
    pending = [(value, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            if depth >= limit:
                return True
            pending.extend((item, depth + 1) for item in (value.values() if isinstance(value, dict) else value))
    return False
