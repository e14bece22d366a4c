"""Build a cache folder once, atomically, even when several processes ask for it at once.

A conversion interrupted half-way must not leave a folder that later loads fail on, and DDP ranks
starting together must not convert the same model twice: build in a temporary sibling folder under
an exclusive file lock, then rename it into place.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_folder_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, first calling `build(temporary_folder)` and renaming it there if missing."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if target.is_dir():  # another process built it while we waited for the lock
            return target
        temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            build(temporary)
            temporary.chmod(0o755)  # mkdtemp makes it owner-only; the cache is meant to be shared
            temporary.rename(target)
        finally:
            if temporary.exists():
                shutil.rmtree(temporary, ignore_errors=True)
    return target
