"""The code game's predictor seat held by another model: a second local model (its own tokenizer, chat
template and sampling) or a served one (a stand-in OpenAI-compatible server here), each answering K
times per valid program, its answers parsed by the game's one format, its tokenizer setting the
programs' output budget."""

from __future__ import annotations

import json

import pytest

from rlcode.errors import SettingError
from rlcode.models.loading import load_tokenizer
from rlcode.modes import CodeGame
from rlcode.training.turn_samples import episode_json
from test_code_game_predictions import ScriptedLearner, pool  # noqa: F401  (the module's sandbox fixture)
from test_openai_backend import MODELS, ok, stub_server  # noqa: F401  (the stand-in server fixture)

PROGRAMS = ["```python\nprint(6 * 7)\n```", "```python\nprint(2 + 2)\n```"]


def _predictor_turns(experience):
    return [[turn for turn in episode.turns if turn.player == 1] for episode in experience.episodes]


def test_another_local_model_predicts_k_times_with_its_own_tokenizer_and_budget(pool, monkeypatch):  # noqa: F811
    from rlcode.envs import opponents

    calls, generate = [], opponents.HFGenerateBackend.generate

    def recorded(self, prompts, num_generations, params):
        rollout = generate(self, prompts, num_generations, params)
        calls.append((self.tokenizer, params, rollout.completion_mask.sum(1).tolist(), list(rollout.completion_texts)))
        return rollout

    monkeypatch.setattr(opponents.HFGenerateBackend, "generate", recorded)
    mode = CodeGame(opponent="model", opponent_model="tiny-random", predictions_per_program=2, num_generations=2,
                    opponent_max_new_tokens=8, opponent_temperature=1.0, program_timeout=2.0)
    learner = ScriptedLearner(pool, list(PROGRAMS), [], max_new_tokens=64)  # no scripted answer: the model answers
    mode.configure(learner)
    experience = mode.collect(learner, {"text": ["numbers"]})
    assert all(episode.turns[0].info["valid"] for episode in experience.episodes)
    predictions = _predictor_turns(experience)
    assert [len(turns) for turns in predictions] == [2, 2], "K = 2 predictions of each valid program"
    assert len(calls) == 2, "one batched call per prediction round"
    tokenizer = mode._predictor_tokenizer(learner)
    assert tokenizer is not None and all(call[0] is tokenizer for call in calls), "the other model's own tokenizer"
    assert all(call[1].max_new_tokens == 8 and call[1].temperature == 1.0 for call in calls)
    assert all(length <= 8 for call in calls for length in call[2])
    answered = sorted(text for call in calls for text in call[3])
    assert sorted(turn.text for turns in predictions for turn in turns) == answered, "the other model's answers"
    assert all(isinstance(turn.info["correct"], bool) for turns in predictions for turn in turns), "parsed alike"
    assert mode._max_output_tokens(learner) == 8, "the budget is the predictor's max_new_tokens, not the policy's 64"
    logged = episode_json(experience.episodes[0])["turns"]  # what rollouts.jsonl keeps of a game
    assert logged[0]["role"] == "writer" and logged[0]["valid"] and logged[0]["output"] == "42"
    assert [turn["expected"] for turn in logged[1:]] == ["42", "42"] and all("correct" in t for t in logged[1:])
    assert all(env_tokenizer is tokenizer for env_tokenizer in _env_tokenizers(mode, learner))


def _env_tokenizers(mode, learner):
    """The tokenizer each game's validity rule counts with (the envs ``collect`` builds)."""
    import rlcode.modes.code_game as mode_module

    seen = []
    original = mode_module.CodeGameEnv

    class Recording(original):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs["tokenizer"])
            super().__init__(*args, **kwargs)

    mode_module.CodeGameEnv = Recording
    try:
        learner.writers = list(PROGRAMS)
        mode.collect(learner, {"text": ["numbers"]})
    finally:
        mode_module.CodeGameEnv = original
    return seen


def test_a_served_predictor_answers_k_times_and_its_named_tokenizer_counts_the_budget(pool, stub_server):  # noqa: F811
    answers = [{"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3}} for text in ("```\n42\n```", "```\n5\n```")]
    server = stub_server({"/v1/models": [ok(MODELS)], "/v1/chat/completions": [ok(a) for a in answers]})
    mode = CodeGame(opponent="served", opponent_server={"base_url": server.base_url, "model": "served-model",
                                                       "api": "chat", "backoff": 0.0},
                    opponent_tokenizer="tiny-random", opponent_max_new_tokens=12, opponent_temperature=0.5,
                    predictions_per_program=2, num_generations=2, program_timeout=2.0)
    learner = ScriptedLearner(pool, [PROGRAMS[0]] * 2, [], max_new_tokens=64)
    mode.configure(learner)
    experience = mode.collect(learner, {"text": ["numbers"]})
    predictions = _predictor_turns(experience)
    assert [len(turns) for turns in predictions] == [2, 2]
    # the stand-in answers 42 once, then 5: one right of four, parsed by the game's format
    assert sorted(turn.info["correct"] for turns in predictions for turn in turns) == [False, False, False, True]
    bodies = [body for path, _, body in server.requests if path == "/v1/chat/completions"]
    assert [body["max_tokens"] for body in bodies] == [12] * 4 and {body["temperature"] for body in bodies} == {0.5}
    assert mode._predictor_tokenizer(learner) is not None and mode._max_output_tokens(learner) == 12
    assert json.dumps(bodies[0]["messages"]).count("print(6 * 7)") == 1, "the predictor saw the program"


def test_the_other_model_settings_are_checked_at_once():
    with pytest.raises(SettingError, match="opponent_model"):
        CodeGame(opponent="model")
    with pytest.raises(SettingError, match="opponent_model"):
        CodeGame(opponent="self", opponent_model="tiny-random")
    with pytest.raises(SettingError, match="opponent_max_new_tokens=0"):
        CodeGame(opponent="model", opponent_model="tiny-random", opponent_max_new_tokens=0)
    with pytest.raises(SettingError, match="opponent_temperature=-1"):
        CodeGame(opponent="model", opponent_model="tiny-random", opponent_temperature=-1)


def test_the_other_model_is_loaded_frozen_in_the_policys_dtype():
    """Loaded in ``configure`` beside the policy: moved to the policy's device and dtype (here a
    float64 policy, which transformers' default fp32 load would not match), and never trained."""
    import torch
    from grpo_harness import learner

    module = learner(CodeGame, model_name="tiny-random", opponent="model", opponent_model="tiny-random")
    module.configure_model()
    module.policy.to(torch.float64)
    module.mode.opponents._other = None  # load again, now beside a float64 policy
    module.mode.opponents.configure(module)
    other, tokenizer = module.mode.opponents._other
    assert other is not module.policy and tokenizer is not None
    assert {p.dtype for p in other.parameters()} == {torch.float64}
    assert {p.device for p in other.parameters()} == {module.device}
    opponent = module.mode.opponents.actor(module)
    assert not any(p.requires_grad for p in other.parameters()) and not other.training, type(opponent).__name__
