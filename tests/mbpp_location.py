"""Where tests read MBPP: ``MBPP_DATASET_PATH``, else the shared copy beside the repository."""

import os
from pathlib import Path

SHARED_MBPP = Path(__file__).resolve().parents[2] / "shared" / "data" / "mbpp" / "mbpp.jsonl"


def mbpp_file() -> Path:
    return Path(os.environ.get("MBPP_DATASET_PATH") or SHARED_MBPP)
