"""The shared-prompt decode attention as one fused CPU kernel, built on first use.

In torch the int8 sampler's decode attention is four small products and ~15 small operations per
layer (``shared_prompt_cache.grouped_decode_attention``): on SmolLM2 most of what a decode step spends
above its int8 weight floor, each operation's dispatch and temporaries costing more than its
arithmetic. The kernel (``csrc/shared_prompt_attention.cpp``) does the same arithmetic in one pass per
prompt and key/value head with no intermediate tensors (``benchmarks/rollout_speed.py --decode-step``
times the step with it and without; its dated runs are in ``benchmarks/journal/speed.md``). It equals the torch attention up to float
rounding (tested), so it is used only where that one is: by the int8 copy, whose log-probs are recorded.

Built with ``torch.utils.cpp_extension`` (a C++ compiler with OpenMP and ninja; ~20 s, once, cached under
``TORCH_EXTENSIONS_DIR`` by a name that includes the source and this CPU's instruction flags, so a
home directory shared by different nodes never loads a build for another CPU). Where it cannot be built
(no compiler, macOS' clang without OpenMP), one log line, and the torch attention decodes.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "shared_prompt_attention.cpp"


@functools.cache
def fused_attention_kernel():
    """The built extension (``shared_prompt_attention(...)``), or None where it cannot be built."""
    try:
        from torch.utils.cpp_extension import load

        _put_ninja_on_path()
        name = f"rlcode_shared_prompt_attention_{_build_key()}"
        if not _built(name):  # the first int8 step otherwise sat ~50 s with no word
            print("int8 sampler: building its fused decode-attention kernel (once per CPU type and torch "
                  "version, ~20-60 s; cached for later runs) ...", flush=True)
        started = time.perf_counter()
        module = load(name=name, sources=[str(SOURCE)],
                      extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as error:  # noqa: BLE001 (any build failure: decode with torch's attention)
        logger.warning("int8 sampler: the fused decode-attention kernel could not be built (%s: %s); decoding "
                       "with torch's attention (slower: a C++ compiler and ninja build it)",
                       type(error).__name__, str(error).strip().splitlines()[-1][:200] if str(error).strip() else "")
        return None
    seconds = time.perf_counter() - started
    if seconds > 2:  # a build, not a cached load
        logger.info("int8 sampler: built the fused decode-attention kernel in %.0f s (cached for later runs)", seconds)
    return module


def _built(name: str) -> bool:
    """Whether torch's extension cache already holds this build (a load then takes ~1 s)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return any(Path(_get_build_directory(name, verbose=False)).glob(f"{name}*.so"))
    except Exception:  # noqa: BLE001 (a private helper: if it moves, say nothing rather than fail)
        return True


def _build_key() -> str:
    """A digest of the source, torch's version and this CPU's instruction set (``-march=native``)."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{torch.__version__} {platform.machine()} {_cpu_flags()}".encode())
    return digest.hexdigest()[:12]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _put_ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the ``ninja`` package's binary is not on it outside an activated venv."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
