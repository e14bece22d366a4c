"""Clocks and memory figures of the GPU checks: step times and completion tokens of a Lightning fit,
tokens/s without the warm-up step, and CUDA's peak memory (each a no-op or None without a GPU, so the
dry run on CPU goes through the same code).

Peak memory is taken per step on both sides of the rlcode / TRL pairs: rlcode's Learner resets CUDA's
peak at each step's start and records it at its end (``StepRecord.memory``), so a peak read once after
the fit would only cover the last step; TRL's side reads and resets at each step's end
(``PeakPerStep``). Each side's figure is the largest step's."""

from __future__ import annotations

import gc
import time


class StepClock:
    """Lightning callback: step ends and completion tokens of each step."""

    def __new__(cls):
        import lightning as L

        class Clock(L.Callback):
            def __init__(self) -> None:
                self.ends, self.tokens, self.stages, self.peaks = [], [], [], []

            def on_train_start(self, trainer, module) -> None:
                self.started = time.perf_counter()

            def on_train_batch_end(self, trainer, module, *args) -> None:
                self.ends.append(time.perf_counter())
                self.tokens.append(sum(module.last_step.completion_lengths) if module.last_step else 0)
                timings = module.last_step.timings if module.last_step else {}
                self.stages.append({stage: round(seconds, 3) for stage, seconds in timings.items()})
                memory = module.last_step.memory if module.last_step else {}
                self.peaks.append(memory.get("gpu_peak_allocated_gib"))

            def summary(self) -> dict:
                """Tokens/s, where each step's time went (the Learner's stage timings), each step's peak."""
                return {**throughput([self.started, *self.ends], self.tokens), "stage_s": self.stages,
                        **step_peaks(self.peaks)}

        return Clock()


def step_peaks(peaks: list) -> dict:
    """``peak_gpu_gb`` (the largest step's, GiB) and ``step_peak_gpu_gb``; None without CUDA."""
    known = [round(peak, 2) for peak in peaks if peak is not None]
    return {"peak_gpu_gb": max(known) if known else None, "step_peak_gpu_gb": known or None}


class PeakPerStep:
    """transformers callback: CUDA's peak since the last step's end, then a new peak (reset before
    ``train()`` so the first step's figure starts there)."""

    def __new__(cls):
        from transformers import TrainerCallback

        class Peaks(TrainerCallback):
            def __init__(self) -> None:
                self.peaks: list = []

            def on_step_end(self, args, state, control, **kwargs):
                self.peaks.append(peak_gb())
                reset_peak()

        return Peaks()


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
