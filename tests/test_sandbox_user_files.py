"""The user's files are out of a sample's reach at every isolation level reachable here (
item 4): a 0600 token in the user's home cannot be read, and nothing can be written outside the
execution's temp dir. Levels: root with bubblewrap (in this process), and, through a helper that
drops to an unprivileged uid, a user with user namespaces (bwrap-userns) and a user without
bubblewrap on PATH (the process level, where Landlock is the only wall). Where no layer hides the
filesystem the pool refuses to start unless the user opts in.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest

import rlcode.sandbox.launch as launch
from rlcode.sandbox import IsolationUnavailable, SandboxPool, Status
from rlcode.sandbox.isolation import ALLOW_VISIBLE_FS_ENV
from unprivileged_user import REPO, TEST_UID, run_as_user

SAMPLE = textwrap.dedent("""
    import json, os, random
    home = {home!r}
    tries = {{}}
    def attempt(label, action):
        try:
            action()
            tries[label] = "ALLOWED"
        except OSError:
            tries[label] = "denied"
    attempt("read-token", lambda: open(home + "/.token").read())
    attempt("list-home", lambda: os.listdir(home))
    name = "/pwned-%d" % random.randrange(10**9)
    for folder in (home, "/tmp", "/var/tmp", {repo!r}):
        attempt("write " + folder, lambda: open(folder + name, "w").write("x"))
    open("mine.txt", "w").write("fine")  # its own temp dir stays writable
    tries["own-tmp"] = open("mine.txt").read()
    print(json.dumps(tries))
""")
RUNNER = textwrap.dedent("""
    import json, sys
    from rlcode.sandbox import SandboxPool
    with SandboxPool(workers=1, timeout=20.0) as pool:
        result = pool.submit(sys.argv[1] if len(sys.argv) > 1 else {sample!r}).result()
        print(json.dumps({{"level": pool.isolation.level, "layers": pool.isolation.layers,
                           "status": result.status.value, "stdout": result.stdout,
                           "stderr": result.stderr}}))
""")


def _home_with_token(owner: int) -> str:
    home = tempfile.mkdtemp(prefix="rlcode-test-home-")
    token = Path(home) / ".token"
    token.write_text("secret-token-3f9c")
    token.chmod(0o600)
    os.chown(home, owner, owner)
    os.chown(token, owner, owner)
    return home


def _assert_contained(tries: dict, home: str) -> None:
    assert tries.pop("own-tmp") == "fine"
    assert set(tries.values()) == {"denied"}, tries
    assert sorted(os.listdir(home)) == [".token"]  # nothing was written there either


def test_root_with_bubblewrap_keeps_the_users_files():
    """Guards the bwrap level (root): token unreadable, home, /tmp, /var/tmp and the repo unwritable."""
    if os.geteuid() != 0 or not shutil.which("bwrap"):
        pytest.skip("needs root and bubblewrap")
    home = _home_with_token(0)
    try:
        with SandboxPool(workers=1, isolation="bwrap") as pool:
            result = pool.submit(SAMPLE.format(home=home, repo=str(REPO))).result()
        assert result.status is Status.OK, result.stderr
        _assert_contained(json.loads(result.stdout), home)
    finally:
        shutil.rmtree(home)


@pytest.mark.parametrize("path, level", [
    (os.environ.get("PATH", "/usr/bin:/bin"), "bwrap-userns"),  # user namespaces
    ("/nonexistent", "process"),                                # bwrap hidden: Landlock alone
])
def test_unprivileged_user_cannot_touch_its_own_files(path, level):
    """Guards the non-root levels, where the child keeps the user's uid (so file permissions do not
    protect the user's own 0600 token): bubblewrap's user namespace, or Landlock without bubblewrap."""
    if os.geteuid() != 0:
        pytest.skip("the helper needs root to become an unprivileged test user")
    if level == "bwrap-userns" and not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed")
    home = _home_with_token(TEST_UID)
    try:
        runner = RUNNER.format(sample=SAMPLE.format(home=home, repo=str(REPO)))
        done = run_as_user(runner, home=home, path=path)
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["level"] == level and report["status"] == "ok", report
        assert report["layers"]["landlock"], report
        _assert_contained(json.loads(report["stdout"]), home)
    finally:
        shutil.rmtree(home)


def test_no_filesystem_hiding_layer_is_refused_unless_opted_in(monkeypatch):
    """Guards the refusal: without bubblewrap and Landlock, a one-line error naming both fixes and
    the opt-in; the config value or the environment variable lets the pool start."""
    monkeypatch.setattr(launch, "landlock_paths", lambda *args, **kwargs: None)
    monkeypatch.delenv(ALLOW_VISIBLE_FS_ENV, raising=False)
    with pytest.raises(IsolationUnavailable) as error:
        SandboxPool(workers=1, isolation="process")
    message = str(error.value)
    assert "\n" not in message and "apt-get install bubblewrap" in message
    assert ALLOW_VISIBLE_FS_ENV in message and "allow_visible_filesystem=True" in message
    with SandboxPool(workers=1, isolation="process", allow_visible_filesystem=True) as pool:
        assert not pool.isolation.layers["landlock"]
        assert pool.submit("print('runs')").result().stdout == "runs\n"
    monkeypatch.setenv(ALLOW_VISIBLE_FS_ENV, "1")
    with SandboxPool(workers=1, isolation="process") as pool:
        assert pool.submit("print('runs')").result().stdout == "runs\n"
