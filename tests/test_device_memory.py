"""Stage times that wait for the device, and the step's peak GPU memory in metrics and the step line.

CUDA is not on these machines: its calls are replaced by counting stand-ins, so what is checked is
that rlcode asks for them where it must (both edges of a timed stage; reset at the step's start,
read at its end) and shows what they answer; on a CPU nothing is asked and nothing is shown."""

from __future__ import annotations

import pytest
import torch

from rlcode.callbacks.metrics import step_line, step_metrics
from rlcode.training import device_memory
from rlcode.training.step_record import timed
from test_callbacks import record


@pytest.fixture
def fake_cuda(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: calls.append(("reset", str(device))))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 12.5 * device_memory.GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 14.0 * device_memory.GIB)
    return calls


def test_a_timed_stage_waits_for_the_device_at_both_edges(fake_cuda):
    timings = {}
    with timed(timings, "update"):
        fake_cuda.append("work")
    assert fake_cuda == ["synchronize", "work", "synchronize"]
    assert timings["update"] >= 0


def test_off_cuda_nothing_is_synchronised_or_recorded():
    assert not torch.cuda.is_available()
    timings = {}
    with timed(timings, "update"):
        pass
    cpu = torch.device("cpu")
    device_memory.reset_peak_memory(cpu)
    assert device_memory.peak_memory_gib(cpu) == {}
    assert "GPU" not in step_line(record()) and not any("gpu" in key for key in step_metrics(record()))


def test_peak_memory_reaches_metrics_and_the_step_line(fake_cuda):
    cuda = torch.device("cuda", 0)
    device_memory.reset_peak_memory(cuda)
    assert fake_cuda == [("reset", "cuda:0")]
    memory = device_memory.peak_memory_gib(cuda)
    assert memory == {"gpu_peak_allocated_gib": 12.5, "gpu_peak_reserved_gib": 14.0}
    step = record(memory=memory)
    metrics = step_metrics(step)
    assert metrics["perf/gpu_peak_allocated_gib"] == 12.5 and metrics["perf/gpu_peak_reserved_gib"] == 14.0
    assert step_line(step).endswith("time=2.0s, GPU peak 12.5 GiB allocated / 14.0 reserved")
