"""Isolation levels: detection, the report, clear errors, fallback, logging, worker recycling."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

import rlcode.sandbox.isolation as isolation
from rlcode.sandbox import IsolationUnavailable, SandboxPool, Status, detect_isolation


def test_detect_reports_every_layer():
    report = detect_isolation()
    assert report.level == "bwrap"  # this machine: root with bubblewrap installed
    assert all(report.layers.values()), report.describe()
    text = report.describe()
    for layer in ("filesystem_hidden", "network_namespace", "seccomp", "pid_namespace_per_execution",
                  "sandbox_uid", "process_limit_per_execution", "rlimits"):
        assert layer in text


def test_process_level_says_what_is_off():
    report = detect_isolation("process")
    assert report.level == "process" and report.weaker_than_bwrap
    assert not report.layers["filesystem_hidden"]
    assert report.layers["network_namespace"] == (os.geteuid() == 0)  # root unshares it without bwrap
    assert report.layers["seccomp"] and "[OFF] filesystem_hidden" in report.describe()


def test_missing_bwrap_is_a_one_line_error_naming_the_fix(monkeypatch):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    with pytest.raises(IsolationUnavailable, match="apt-get install bubblewrap") as error:
        detect_isolation("bwrap")
    assert "\n" not in str(error.value)


def test_auto_falls_back_to_process_with_a_warning(monkeypatch, caplog):
    monkeypatch.setattr(isolation.shutil, "which", lambda name: None)
    with caplog.at_level(logging.INFO, logger="rlcode.sandbox"):
        with SandboxPool(workers=1, isolation="auto") as pool:
            assert pool.isolation.level == "process"
            assert pool.submit("print('works')").result().stdout == "works\n"
    messages = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert any(level == "INFO" and "isolation process" in text for level, text in messages)
    assert any(level == "WARNING" and "weaker than bwrap" in text for level, text in messages)


def test_debug_line_per_execution(caplog):
    with caplog.at_level(logging.DEBUG, logger="rlcode.sandbox"):
        with SandboxPool(workers=1, tags={"run": "t"}) as pool:
            pool.submit("print(1)").result()
    lines = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    assert any("status=ok" in line and "'run': 't'" in line and "stdout=2B" in line for line in lines)


def test_workers_are_recycled():
    with SandboxPool(workers=1, recycle_after=2) as pool:
        pids = []
        for _ in range(5):
            assert pool.submit("pass").result().status is Status.OK
            pids.append(pool._slots[0].worker.pid)
    assert pids[0] == pids[1] and pids[1] != pids[2] and pids[2] == pids[3] and pids[3] != pids[4]


def test_landlock_audit_logging_is_off_where_the_kernel_logs():
    """ABI 7 logs every denial to the host's audit log unless told not to: the child's domain is
    entered with the log-off flags (its own and nested domains'), which the kernel accepts."""
    import subprocess
    import sys

    from rlcode.sandbox.inside import landlock

    assert landlock.restrict_flags(6) == 0 and landlock.restrict_flags(7) == 5
    abi = landlock.abi_version()
    if abi < 7:
        pytest.skip(f"Landlock ABI {abi}: no audit logging to turn off")
    entered = subprocess.run([sys.executable, "-c", (
        "import ctypes, sys\n"
        f"sys.path.insert(0, {str(Path(landlock.__file__).parent)!r})\n"
        "import landlock\n"
        "policy = landlock.Policy(landlock.abi_version(), ['/usr'], [])\n"
        "ctypes.CDLL(None).prctl(38, 1, 0, 0, 0)\n"  # no_new_privs, as the child sets it
        "landlock.restrict_self(policy.build([]), landlock.restrict_flags(landlock.abi_version()))\n"
        "try:\n    open('/etc/hostname')\nexcept PermissionError:\n    print('confined')\n")],
        capture_output=True, text=True, timeout=60)
    assert entered.stdout == "confined\n", entered.stderr
