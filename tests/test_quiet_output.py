"""A normal run's log written to a file: plain lines, and no library warnings a user cannot act on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rlcode.models.cache_name import cache_argument, output_cache

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml")]
NOISE = ("past_key_values", "cache_params", "FutureWarning", "Checkpoint directory", "weights_only",
         "dirpath has changed", "anonymous", "Seed set to", "Loading weights", "gradient_checkpointing",
         "gemm_4bit_forward")


def _fit(log: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    with log.open("a") as out:  # a file, not a terminal, for stdout and stderr
        subprocess.run([sys.executable, "-m", "rlcode.cli", "fit", *TINY, *args], cwd=REPO, env=env, stdout=out,
                       stderr=subprocess.STDOUT, check=True, timeout=600)


@pytest.mark.slow
def test_a_logged_run_has_plain_lines_and_no_library_noise(tmp_path):
    log, root = tmp_path / "run.log", ["--run.root_dir", str(tmp_path / "runs")]
    # a first run with its progress bar asked for and W&B offline; its resume (into a checkpoint
    # directory that is not empty); a new run started from the first run's checkpoint (another dirpath);
    # a LoRA run (peft and bitsandbytes load)
    _fit(log, *root, "--trainer.enable_progress_bar", "true", "--run.wandb", "offline")
    _fit(log, *root, "--trainer.max_steps", "3", "--ckpt_path", "last")
    first = tmp_path / "runs/tiny/version_0/checkpoints/last.ckpt"
    _fit(log, *root, "--trainer.max_steps", "4", "--run.experiment", "other", "--ckpt_path", str(first))
    _fit(log, *root, "--trainer.max_steps", "1", "--run.experiment", "lora", "--model.lora.r", "4")
    text = log.read_text()
    assert text.count("rlcode fit finished") == 4, text  # every run did run
    assert "Step 2: reward=" in text and "Step 3: reward=" in text, text
    assert "\r" not in text
    config = yaml.safe_load((tmp_path / "runs/tiny/version_0/config.yaml").read_text())
    assert config["weights_only"] is True  # torch's safe unpickler, said explicitly (no warning on any torch)
    for noise in NOISE:
        assert noise not in text, (noise, [line for line in text.splitlines() if noise in line])


class _OldStyleModel(torch.nn.Module):
    def forward(self, input_ids, past_key_values=None, use_cache=False):
        return input_ids


def test_the_cache_keyword_is_the_one_the_model_takes():
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlcode.models.loading import resolve_model_source

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_source("tiny-random")))
    name = cache_argument(model)
    output = model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
    assert output_cache(output) is not None
    assert name in ("cache", "past_key_values") and hasattr(type(output), "__dataclass_fields__")
    assert (name == "cache") == ("cache" in type(output).__dataclass_fields__)  # one transformers release's names
    assert cache_argument(_OldStyleModel()) == "past_key_values"  # a remote-code model that keeps the old name
