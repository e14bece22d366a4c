"""One line per scored batch of an MBPP eval: problems done / total, pass rate so far, problems/s.

A 90-problem greedy eval of a small model takes minutes on a CPU; without these lines it looked
stalled, and a pass rate that is already off after a few batches (a wrong prompt format, a broken
sandbox) could only be seen at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable


class EvalProgress:
    """Counts scored problems and prints a line after each batch.

    Args:
        label: what is scored, e.g. "MBPP validate".
        total: problems the eval will score (None: unknown, the line shows only those done).
        say: where lines go (default: stdout on rank zero, above any progress bar).
        last_line: print the line of the batch that completes ``total`` too (False when the caller
            prints its own summary right after it).
    """

    def __init__(self, label: str, total: int | None, say: Callable[[str], None] | None = None,
                 last_line: bool = True) -> None:
        self.label = label
        self.total = total
        self.say = say or write_line
        self.last_line = last_line
        self.done = 0
        self.passed = 0
        self._started = self._updated = time.perf_counter()

    def add(self, passed: Iterable[bool]) -> None:
        """Record one batch's verdicts (greedy pass/fail per problem) and print the line."""
        passed = list(passed)
        self.done += len(passed)
        self.passed += sum(passed)
        self._updated = time.perf_counter()
        if self.last_line or self.total is None or self.done < self.total:
            self.say(self.line())

    @property
    def problems_per_second(self) -> float:
        """Problems scored per second of wall time, up to the last batch recorded."""
        return self.done / max(self._updated - self._started, 1e-9)

    def line(self) -> str:
        done = f"{self.done}/{self.total}" if self.total is not None else str(self.done)
        rate = self.passed / self.done if self.done else 0.0
        return (f"  {self.label}: {done} problems, pass rate {rate:.3f} ({self.passed}/{self.done}), "
                f"{self.problems_per_second:.3f} problems/s")


def write_line(line: str) -> None:
    """Print on rank zero through tqdm, as the step lines do (callbacks/metrics.py): the line goes
    above a running progress bar instead of into it, and a redirected log gets it at once."""
    # lightning imports torch (seconds): rlcode.eval stays torch-free for rlcode-eval
    from lightning.pytorch.utilities import rank_zero_only
    from tqdm import tqdm

    if rank_zero_only.rank == 0:
        tqdm.write(line)
        sys.stdout.flush()


def problems_in_eval_loop(trainer, testing: bool) -> int | None:
    """Problems the running ``rlcode validate`` / ``test`` loop will score in this process: the sizes
    of the batches it runs (after ``limit_val_batches`` / ``limit_test_batches``). None when that is
    not known up front: several ranks each take a share, or the loader is not a list of batches."""
    loader = trainer.test_dataloaders if testing else trainer.val_dataloaders
    counts = trainer.num_test_batches if testing else trainer.num_val_batches
    batches = getattr(loader, "dataset", None)
    if trainer.world_size != 1 or not isinstance(batches, list) or not counts or counts[0] == float("inf"):
        return None
    return sum(len(batch["task_id"]) for batch in batches[: int(counts[0])])
