"""Build a cache folder once, atomically, even when several processes ask for it at once.

A conversion interrupted half-way must not leave a folder that later loads fail on, and DDP ranks
starting together must not convert the same model twice: build in a temporary sibling folder under
an exclusive file lock, write a completion marker into it last, then rename it into place. A
folder without the marker (seen on a shared machine: the folder existed, its model files did not)
is not a cache: it is moved aside and rebuilt.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

COMPLETE_MARKER = ".rlcode-complete"  # written after build() returned, so its presence means done


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


def build_folder_once(target: Path, build: Callable[[Path], None]) -> Path:
    """Return `target`, first calling `build(temporary_folder)` and renaming it there if missing
    or incomplete (no completion marker)."""
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    with open(lock_path, "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        if is_complete(target):  # another process built it while we waited for the lock
            return target
        if target.exists():  # incomplete: set aside (a rename, so a reader never sees half of it)
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.incomplete-", dir=target.parent))
            target.rename(stale / target.name)
            shutil.rmtree(stale, ignore_errors=True)
        temporary = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
        try:
            build(temporary)
            (temporary / COMPLETE_MARKER).write_text("built by rlcode; delete this folder to rebuild it\n")
            temporary.chmod(0o755)  # mkdtemp makes it owner-only; the cache is meant to be shared
            temporary.rename(target)
        finally:
            if temporary.exists():
                shutil.rmtree(temporary, ignore_errors=True)
    return target
