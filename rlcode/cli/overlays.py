"""Overlays: configs that name only what they change and go after a recipe (``--config RECIPE
--config OVERLAY``). Alone, an overlay runs on the defaults of every key it leaves out (the tiny GRPO
overlay alone trained SmolLM2 on every MBPP problem), so a command whose configs are all overlays is
refused.

An overlay says so in its first line, which also names what it goes after::

    # Overlay, not a recipe: goes after --config configs/quickstart.yaml --config configs/tiny_test.yaml

A comment, not a key: jsonargparse rejects keys no class reads, and the line is the one a reader sees.
"""

from __future__ import annotations

import re
from pathlib import Path

from rlcode.cli.errors import UserError

OVERLAY_MARK = "# Overlay, not a recipe: "


def overlay_note(path: str | Path) -> str | None:
    """What the overlay at ``path`` goes after (its first line, less the mark); None for a recipe."""
    try:
        with open(path, encoding="utf-8") as handle:
            first = handle.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return None  # not a readable file (an inline YAML string): jsonargparse decides
    return first[len(OVERLAY_MARK):] if first.startswith(OVERLAY_MARK) else None


def overlay_bases(path: str | Path) -> list[str]:
    """The configs the overlay's first line names before it, in order (paths relative to the repository)."""
    note = overlay_note(path) or ""
    return [name for name in re.findall(r"--config (\S+)", note) if Path(name).name != Path(path).name]


def config_files(arguments: list[str]) -> list[str]:
    """The ``--config`` values of a command line, in order."""
    files = []
    for index, word in enumerate(arguments):
        if word == "--config" and index + 1 < len(arguments):
            files.append(arguments[index + 1])
        elif word.startswith("--config="):
            files.append(word.split("=", 1)[1])
    return files


def check_not_only_overlays(arguments: list[str]) -> None:
    """Refuse, in one line, a command whose ``--config`` files are all overlays."""
    files = config_files(arguments)
    notes = [overlay_note(path) for path in files]
    if files and all(notes):
        raise UserError(f"{files[0]} is an overlay, not a recipe: it {notes[0]}")
