"""The repository stands on its own: no file points at notes kept outside it (a measured-facts or design
file, the tracker's issue numbers, the documents the project was specified from). A reader of a
clone has none of them, so the fact itself belongs where it is used. The Makefile and CI are the one
exception: they read MBPP from the copy vendored beside the checkout."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".git", ".venv", ".venv-latest", ".venv-vllm-stack", ".venv-device-stack", ".device-wheels", "runs", "lightning_logs", "wandb", "__pycache__", "build"}
ALLOWED_TO_READ_THE_VENDORED_COPY = {"Makefile", ".ci/run"}
# Spelled in pieces so this file does not match itself.
OUTSIDE_REFERENCES = re.compile(
    "|".join([r"\bFACTS" + r"(\.md)?\b", r"\bDESIGN" + r"\.md\b", r"\b[Ii]ssues? #?\d", r"seed" + r" project",
              r"\bthe (ART )?seed" + r"'s\b", r"\.\./" + r"shared\b"]))


def _text_files():
    """Every file git would commit (tracked, or new and not ignored): no venv or build output."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    for name in filter(None, listed.split("\0")):
        rel, path = Path(name), ROOT / name
        if not path.is_file() or any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        try:
            yield rel, path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files hold no prose


def test_no_file_refers_to_notes_outside_the_repository():
    found = []
    for rel, text in _text_files():
        for lineno, line in enumerate(text.splitlines(), 1):
            match = OUTSIDE_REFERENCES.search(line)
            if match and not (str(rel) in ALLOWED_TO_READ_THE_VENDORED_COPY and "shared" in match.group()):
                found.append(f"{rel}:{lineno}: {line.strip()[:100]}")
    assert not found, "state the fact instead of pointing outside the repository:\n" + "\n".join(found)
