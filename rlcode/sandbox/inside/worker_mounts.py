"""The worker's own mount namespace at the process level (no bubblewrap), as root. Standalone stdlib
code (runs in the worker, see worker_main.py).

Mounts made here (the scratch tmpfs, the python prefix made reachable) are the worker's and its
children's only: nothing propagates back to the host.
"""

import ctypes
import os

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 0x4000, 1 << 18
_libc = ctypes.CDLL(None, use_errno=True)
_private = []  # set once this process has its private mount namespace


def private_mount_namespace() -> bool:
    """Enter a mount namespace of our own, with every mount private (idempotent)."""
    if _private:
        return True
    if _libc.unshare(CLONE_NEWNS) != 0:
        return False
    if _libc.mount(None, b"/", None, ctypes.c_ulong(MS_REC | MS_PRIVATE), None) != 0:
        return False
    _private.append(True)
    return True


def expose_to_sandbox_user(path: str) -> bool:
    """Without bwrap, a root worker's children drop to a sandbox uid, which cannot enter a python
    prefix under a 0700 directory (pyenv in /root): only modules imported before the fork would
    work. So in a private mount namespace of the worker (inherited by its children), cover that
    directory with an empty 0755 tmpfs (hiding the rest of it) and bind the prefix back, read-only."""
    parts = path.rstrip("/").split("/")
    ancestors = ["/".join(parts[:i]) for i in range(2, len(parts) + 1)]
    blocked = [a for a in ancestors if not os.stat(a).st_mode & 0o001]
    if not blocked:
        return True
    if blocked[0] == path or not private_mount_namespace():
        return False
    keep = os.open(path, os.O_PATH | os.O_DIRECTORY)
    flags = MS_NOSUID | MS_NODEV
    if _libc.mount(b"tmpfs", blocked[0].encode(), b"tmpfs", ctypes.c_ulong(flags), b"mode=0755,size=1m") != 0:
        return False
    os.makedirs(path, mode=0o755, exist_ok=True)
    source = f"/proc/self/fd/{keep}".encode()
    if _libc.mount(source, path.encode(), None, ctypes.c_ulong(MS_BIND | MS_REC), None) != 0:
        return False
    _libc.mount(None, path.encode(), None, ctypes.c_ulong(MS_BIND | MS_REMOUNT | MS_RDONLY | flags), None)
    os.close(keep)
    return True
