"""Clocks and memory figures of the GPU checks: step times and completion tokens of a Lightning fit,
tokens/s without the warm-up step, and CUDA's peak memory (each a no-op or None without a GPU, so the
dry run on CPU goes through the same code)."""

from __future__ import annotations

import gc
import time


class StepClock:
    """Lightning callback: step ends and completion tokens of each step."""

    def __new__(cls):
        import lightning as L

        class Clock(L.Callback):
            def __init__(self) -> None:
                self.ends, self.tokens, self.stages = [], [], []

            def on_train_start(self, trainer, module) -> None:
                self.started = time.perf_counter()

            def on_train_batch_end(self, trainer, module, *args) -> None:
                self.ends.append(time.perf_counter())
                self.tokens.append(sum(module.last_step.completion_lengths) if module.last_step else 0)
                timings = module.last_step.timings if module.last_step else {}
                self.stages.append({stage: round(seconds, 3) for stage, seconds in timings.items()})

            def summary(self) -> dict:
                """Tokens/s, and where each step's time went (the Learner's stage timings)."""
                return {**throughput([self.started, *self.ends], self.tokens), "stage_s": self.stages}

        return Clock()


def throughput(times: list[float], tokens: list[int]) -> dict:
    steps = [b - a for a, b in zip(times, times[1:])]
    timed = slice(1, None) if len(steps) > 1 else slice(0, None)  # leave the warm-up step out
    seconds, count = sum(steps[timed]), sum(tokens[timed])
    return {"step_s": [round(s, 3) for s in steps], "tokens_per_s": round(count / seconds, 1) if seconds else None}


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_gb() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
