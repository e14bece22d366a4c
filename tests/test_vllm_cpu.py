"""The vLLM backend through real vLLM: its CPU build (``make test-vllm`` installs it in .venv-vllm)
on SmolLM2-135M in float32, so its greedy tokens can be compared with the HF backend's exactly.

One engine per policy for the module (a build takes ~30-60 s on 2 cores). Each weight test would
fail if the push were skipped: ``test_an_update_reaches_the_engine_when_the_trainer_says_so``
generates once before saying the weights changed and must then get the old tokens back (what a
skipped push leaves), and the LoRA engine starts from the folder's base weights, so without the
merged push its tokens would be the base's.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlcode.logprobs.sequence_logps import completion_logps
from rlcode.models import LoraSettings, load_model, load_tokenizer, reference_mode
from rlcode.models.loading import resolve_model_source
from rlcode.rollout.base import SamplingParams
from rlcode.rollout.hf_backend import HFGenerateBackend
from rlcode.rollout.vllm.backend import VLLMBackend
from rlcode.rollout.vllm.engine import DEFAULT_MAX_MODEL_LEN, VLLMSettings

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[1]
NAME = "smollm2-135m-instruct"
# Float32 like the policy (vLLM's "auto" runs a float32 checkpoint in bf16 on CPU); no compile
# (a one-time ~80 s); a KV cache of its own size (sized by share, on CPU it would be the share of host
# memory less all this process holds): 0.5 GiB, ~11k tokens of SmolLM2 in float32.
SETTINGS = dict(kv_cache_gib=0.5, enforce_eager=True, dtype="float32")
PROMPTS = ["def add(a, b):", "Write a Python function that reverses a string."]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(NAME)


@pytest.fixture(scope="module")
def policy():
    return load_model(NAME)


@pytest.fixture(scope="class")
def engine(policy, tokenizer):
    backend = VLLMBackend(policy, tokenizer, resolve_model_source(NAME), VLLMSettings(**SETTINGS), seed=0)
    yield backend
    shut_down(backend)


def shut_down(backend) -> None:
    """Free an engine's memory: vLLM's CPU build counts this process's memory against the next one's."""
    if backend.llm is not None:
        backend.llm.llm_engine.engine_core.shutdown()
        backend.llm = None
    gc.collect()


def greedy(backend) -> torch.Tensor:
    return backend.generate(PROMPTS, 1, GREEDY).completion_ids


class TestOneEngine:
    """The plain policy's engine, shut down after these (before the LoRA policy's is built)."""

    def test_greedy_tokens_equal_the_hf_backends_and_max_model_len_comes_from_the_model(self, engine, policy, tokenizer):
        assert torch.equal(greedy(engine), greedy(HFGenerateBackend(policy, tokenizer)))
        # unset: the smaller of rlcode's default and the model's limit (SmolLM2: 8192)
        assert engine.llm.llm_engine.model_config.max_model_len == min(DEFAULT_MAX_MODEL_LEN,
                                                                     policy.config.max_position_embeddings)


    def test_the_sampler_log_probs_are_the_sampled_distributions(self, engine, policy):
        """vLLM's log-prob of each sampled token, which the importance correction compares with the
        trainer's, is the policy's at the sampling temperature: at 0.7 it must sit at least a hundred times
        closer to the trainer's log-probs at 0.7 than to those at 1.0 (what raw, unprocessed log-probs would
        give), so neither float32 rounding (~1e-5 nats) nor the wrong distribution (~0.1) can pass for the other."""
        rollout = engine.generate(PROMPTS, 2, SamplingParams(temperature=0.7, max_new_tokens=16, seed=5))
        assert rollout.sampling_logps is not None
        mask = rollout.completion_mask.bool()
        with torch.no_grad():
            at = {t: completion_logps(policy, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                      rollout.completion_mask, t)[mask] for t in (0.7, 1.0)}
        sampled = rollout.sampling_logps[mask]
        right, wrong = float((sampled - at[0.7]).abs().max()), float((sampled - at[1.0]).abs().mean())
        assert right * 100 <= wrong, f"max gap {right:.2e} at the sampling temperature, mean {wrong:.2e} at 1.0"


    def test_an_update_reaches_the_engine_when_the_trainer_says_so(self, engine, policy, tokenizer):
        before = greedy(engine)
        torch.manual_seed(0)
        with torch.no_grad():  # an update of every weight, the tied embedding-head included
            for parameter in policy.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.02 * parameter.abs().mean())
        expected = greedy(HFGenerateBackend(policy, tokenizer))
        assert not torch.equal(expected, before), "the update must change the greedy tokens for this test to see it"
        assert torch.equal(greedy(engine), before), "no push before the trainer says the weights changed"
        engine.weights_changed()
        assert torch.equal(greedy(engine), expected)


def test_a_lora_policy_is_served_merged(tokenizer):
    policy = load_model(NAME, lora=LoraSettings(r=8, alpha=16, dropout=0.0))
    torch.manual_seed(1)
    with torch.no_grad():  # trained adapters: lora_B starts at zero
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.02)
    hf = HFGenerateBackend(policy, tokenizer)
    with reference_mode(policy):
        base = greedy(hf)
    expected = greedy(hf)
    assert not torch.equal(expected, base), "the adapters must change the greedy tokens for this test to see them"
    engine = VLLMBackend(policy, tokenizer, resolve_model_source(NAME), VLLMSettings(**SETTINGS), seed=0)
    try:
        assert torch.equal(greedy(engine), expected)
    finally:
        shut_down(engine)


def test_what_vllms_cpu_build_cannot_run_is_one_line_before_the_build(tokenizer):
    tiny = load_model("tiny-random")  # head size 16
    with pytest.raises(ValueError, match="head size is 16"):
        VLLMBackend(tiny, load_tokenizer("tiny-random"), resolve_model_source("tiny-random"), VLLMSettings())
    with pytest.raises(ValueError, match="enable_sleep_mode needs a GPU"):
        VLLMBackend(load_model(NAME), tokenizer, resolve_model_source(NAME), VLLMSettings(enable_sleep_mode=True))
    with pytest.raises(ValueError, match="exceeds the model's limit of 8192"):
        VLLMBackend(load_model(NAME), tokenizer, resolve_model_source(NAME), VLLMSettings(max_model_len=10000))


# Every mode through `rlcode fit` with the vLLM backend on SmolLM2, 2 steps: step 1 samples from the
# engine after step 0's update. Its importance log-ratios (the trainer's log-probs against vLLM's) then
# stay at float32 rounding, as at step 0; an engine left with step 0's weights would sample another
# policy, off by the update (learning rate 1e-3: far more than rounding). The multi-step and code-game
# rewards get tests/test_fsdp_modes.py's deterministic bonus so that step 0 updates.
MODE_RUNS = {
    "spiral_frozen": ["--config", "configs/spiral_tictactoe.yaml", "--data.init_args.episodes_per_step", "2",
                      "--model.mode.init_args.opponent", "frozen", "--model.mode.init_args.max_turns", "4"],
    "multistep": ["--config", "configs/multistep_mbpp.yaml", "--data.num_train_tasks", "4", "--data.curriculum", "null",
                  "--data.prompts_per_step", "1", "--model.mode.init_args.num_generations", "2",
                  "--model.mode.init_args.max_attempts", "2", "--model.skip_zero_advantage_rows", "false",
                  "--model.mode.init_args.sandbox.workers", "1", "--model.max_new_tokens", "32"],
    "code_game": ["--config", "configs/code_game.yaml", "--model.mode.init_args.opponent", "frozen",
                  "--model.mode.init_args.sandbox.workers", "1", "--model.max_new_tokens", "32"],
}
ROUNDING_TIMES = 100  # step 1's largest |log ratio| may be this many times step 0's, nowhere near an update's


def _fit(out: Path, mode: str) -> None:
    """One 2-step fit (this file run as a script: each fit builds its engine in a fresh process, as a
    run does; vLLM's process groups do not outlive a Lightning run's teardown in one process)."""
    from rlcode.cli.command import main
    from test_fsdp_modes import _patch_rewards

    _patch_rewards()
    vllm = json.dumps({**SETTINGS, "max_model_len": 2048})
    main(["fit", *MODE_RUNS[mode], "--run.root_dir", str(out), "--trainer.max_steps", "2",
          "--model.rollout_backend", "vllm", "--model.vllm", vllm, "--model.learning_rate", "1e-3",
          "--trainer.precision", "32-true", "--eval.at_start", "false", "--eval.at_end", "false",
          "--checkpoint.every_n_train_steps", "0"])


@pytest.mark.parametrize("mode", list(MODE_RUNS))
def test_every_mode_samples_step_one_from_the_updated_weights(tmp_path, mode):
    import csv

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run([sys.executable, __file__, str(tmp_path), mode], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    (metrics,) = tmp_path.glob("*/version_0/metrics.csv")
    with metrics.open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("loss/importance_log_ratio_abs_max")]
    assert len(rows) == 2, f"{len(rows)} steps logged the importance correction"
    first, second = (float(row["loss/importance_log_ratio_abs_max"]) for row in rows)
    assert second <= ROUNDING_TIMES * max(first, 1e-6), f"step 1 sampled another policy: |log ratio| {second:.2e}"
    print(f"{mode}: |log ratio| max {first:.2e} at step 0, {second:.2e} at step 1")


if __name__ == "__main__":
    _fit(Path(sys.argv[1]), sys.argv[2])
