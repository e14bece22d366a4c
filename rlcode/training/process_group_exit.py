"""Leaving torch.distributed's process group at the end of a successful multi-process run.

Lightning leaves the process group to interpreter teardown. There, gloo's worker threads can still
hold finished collectives' work, and destroying it then aborts the process ("terminate called without
an active exception", exit code -6) after a run that succeeded: seen in CI on two-rank FSDP fits on
CPU. c10d's documented practice is to destroy the group while the interpreter is alive. Every rank
that gets here finished the run, so a barrier first is safe; after an error it is not called (a
failed rank may never reach the barrier, and the others would wait on it).
"""

from __future__ import annotations

import torch.distributed as dist


def leave_process_group() -> None:
    """Destroy the default process group (and every group made from it), if this process is in one."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # no rank tears gloo down while another still talks to it
        dist.destroy_process_group()
