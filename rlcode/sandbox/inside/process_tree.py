"""Killing what an execution left behind when no PID namespace does it for us. Standalone stdlib
code (runs in the worker, see worker_main.py), for a worker that is its children's subreaper."""

import os
import signal
import time


def kill_descendants(pid: int, spare: int) -> None:
    """Without a PID namespace: kill the child's process group until it is empty (a fork bomb's
    new members are caught by the kernel's fork-vs-signal check), then, as subreaper, every
    orphan that left the group (setsid) and was reparented to us, until we have no children but
    ``spare`` (the template that forks the children)."""
    for _ in range(100):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            break
        reap_all()
    for _ in range(200):
        children = [child for child in children_of(os.getpid()) if child != spare]
        if not children:
            break
        for child in children:
            for kill in (os.killpg, os.kill):  # its whole group first, if it leads one
                try:
                    kill(child, signal.SIGKILL)
                except OSError:
                    pass
        reap_all()
        time.sleep(0.001)
    reap_all()


def children_of(parent: int) -> list:
    try:
        with open(f"/proc/{parent}/task/{parent}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        pass
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == parent:
                    found.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return found


def tasks_of_uid(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/status") as f:
                    fields = dict(line.split(":", 1) for line in f if ":" in line)
                if int(fields["Uid"].split()[0]) == uid:
                    count += int(fields.get("Threads", "1"))
            except (OSError, KeyError, ValueError):
                pass
    return count


def reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
