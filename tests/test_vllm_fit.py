"""`rlcode fit / validate` with the vLLM backend, its engine a stand-in (vLLM needs CUDA): every
generate samples from the policy's current weights, and the importance-sampling correction runs."""

from __future__ import annotations

import csv
import sys

import pytest
import torch

import vllm_stand_in
from rlcode.cli.command import main
from rlcode.envs.runner import EpisodeRunner
from test_grpo_fit import BASE, fit, initial_weights, policy_weights

VLLM = ["--model.rollout_backend", "vllm", "--model.vllm", '{"max_model_len": 1024}']


@pytest.fixture(autouse=True)
def vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", vllm_stand_in.module())


def engine():
    (llm,) = vllm_stand_in.LLM.instances  # one engine per run
    return llm


def assert_engine_holds(snapshot: dict[str, torch.Tensor], checkpoint: dict[str, torch.Tensor]) -> None:
    assert snapshot, "the engine was never given weights"
    for name, tensor in snapshot.items():
        assert torch.equal(tensor, checkpoint[f"policy.{name}"]), name


def test_every_generate_samples_from_the_current_weights(tmp_path):
    run = fit(tmp_path, *VLLM)  # eval at start, steps 0 and 1, eval at the end
    llm = engine()
    generates = llm.weights_at_generate
    assert len(generates) == 4
    assert_engine_holds(generates[0], initial_weights())
    assert_engine_holds(generates[1], initial_weights())  # step 0 samples what the eval at start did
    assert_engine_holds(generates[2], policy_weights(run / "checkpoints/step-1.ckpt"))
    assert_engine_holds(generates[3], policy_weights(run / "checkpoints/step-2.ckpt"))
    assert sum(event == ("reset_prefix_cache",) for event in llm.log) == 3  # start, after each update
    with (run / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("loss/importance_weight_mean")]
    assert len(rows) == 2
    for row in rows:
        assert 0 < float(row["loss/importance_weight_min"]) <= float(row["loss/importance_weight_max"]) <= 3.0


def test_a_resumed_run_evaluates_the_checkpoint_before_its_first_step(tmp_path):
    fit(tmp_path, *VLLM, "--eval.at_end", "false")
    vllm_stand_in.LLM.instances.clear()
    run = fit(tmp_path, *VLLM, "--trainer.max_steps", "3", "--ckpt_path", "last", "--eval.at_end", "false")
    assert_engine_holds(engine().weights_at_generate[0], policy_weights(run / "checkpoints/step-2.ckpt"))


def test_validate_with_a_checkpoint_generates_from_it(tmp_path):
    run = fit(tmp_path, *VLLM, "--eval.at_start", "false", "--eval.at_end", "false")
    vllm_stand_in.LLM.instances.clear()
    main(["validate", *BASE, *VLLM, "--run.root_dir", str(tmp_path / "validate"),
          "--ckpt_path", str(run / "checkpoints/last.ckpt")])
    assert_engine_holds(engine().weights_at_generate[0], policy_weights(run / "checkpoints/last.ckpt"))


# ---- multi-turn modes: the sampler's log-probs travel with the turns --------------------------------
def test_turn_samples_keep_the_samplers_logprobs(tmp_path):
    """SPIRAL, multi-step and the code game share the episode runner: each learner turn keeps vLLM's
    log-probs of its sampled tokens, and the training rows carry them."""
    from rlcode.modes import SPIRAL
    from grpo_harness import learner
    from rlcode.training.turn_samples import EpisodeTurns
    from test_spiral import ScriptedGame

    module = learner(SPIRAL, model_name="tiny-random", rollout_backend="vllm", max_new_tokens=6, temperature=1.0,
                    vllm={"max_model_len": 512})
    module.configure_model()
    runner = EpisodeRunner(module.render, module.turn_generator(1.0))
    episodes = runner.play([ScriptedGame(n) for n in (1, 2, 3)], [0, 1, 2], [(0, 1)] * 3)
    samples = EpisodeTurns.from_episodes(episodes, module.tokenizer.pad_token_id, "cpu")
    turns = [turn for episode in episodes for turn in episode.turns]
    assert samples.rollout.sampling_logps is not None and len(turns) == 6
    for row, turn in enumerate(turns):
        expected = [vllm_stand_in.sampled_logprob(position) for position in range(len(turn.completion_ids))]
        assert turn.sampling_logps == expected
        assert samples.rollout.sampling_logps[row, :len(expected)].tolist() == expected


def test_spiral_fit_applies_the_importance_correction(tmp_path):
    from test_spiral import SPIRAL as SPIRAL_CONFIG

    main(["fit", *SPIRAL_CONFIG, *VLLM, "--run.root_dir", str(tmp_path), "--trainer.max_steps", "1",
          "--eval.at_start", "false", "--eval.at_end", "false"])
    run = next(tmp_path.glob("tiny/version_*"))
    with (run / "metrics.csv").open() as handle:
        rows = [row for row in csv.DictReader(handle) if row.get("loss/importance_weight_mean")]
    assert len(rows) == 1
    assert 0 < float(rows[0]["loss/importance_weight_min"]) <= float(rows[0]["loss/importance_weight_max"]) <= 3.0
