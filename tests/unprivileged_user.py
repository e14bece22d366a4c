"""Run a test program as an unprivileged user, from a test run as root: the non-root isolation
levels (bwrap-userns, and process as another user) can only be reached that way here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_UID = 61000  # any unprivileged uid: it needs no passwd entry
HELPER = textwrap.dedent("""
    import os, sys
    repo, uid, home, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    sys.path.insert(0, repo)
    from rlcode.sandbox.inside import worker_mounts  # stdlib-only: safe to import as root here
    # The interpreter may live under root's 0700 home (pyenv): reachable read-only, in a private
    # mount namespace of this helper only.
    if not worker_mounts.expose_to_sandbox_user(os.path.realpath(sys.base_prefix)):
        sys.exit("could not make the python prefix reachable for uid %d" % uid)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    env = {"HOME": home, "PATH": path, "PYTHONPATH": repo}
    os.execve(sys.executable, [sys.executable, "-c", sys.argv[5], *sys.argv[6:]], env)
""")


def run_as_user(program: str, *args: str, home: str, path: str, timeout: float = 180
                ) -> subprocess.CompletedProcess:
    """``python -c program args...`` as TEST_UID with only HOME, PATH and PYTHONPATH (the repo) set.
    The caller must be root."""
    assert os.geteuid() == 0, "only root can become the test user"
    return subprocess.run([sys.executable, "-c", HELPER, str(REPO), str(TEST_UID), home, path, program, *args],
                          capture_output=True, text=True, timeout=timeout)
