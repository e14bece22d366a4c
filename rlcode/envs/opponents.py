"""Fixed opponents for the seats the trained policy does not hold.

- ``RandomLegalMover``: a uniformly random legal move (what SPIRAL evaluates against); needs an
  environment that lists its legal moves (``TextArenaGame.legal_moves``).
- ``PolicyOpponent``: another model answering through its own generation call, e.g. a frozen copy
  of the starting policy (``rlcode.modes.opponents`` builds it).
- ``LocalModelOpponent``: another Hugging Face model in this process, with its own tokenizer, chat
  template and sampling settings (the code game's fixed predictor).
- ``ServedOpponent``: a model behind an OpenAI-compatible server (SPIRAL's served opponents), sent
  each turn's chat messages; any environment whose turns are messages can use it.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Callable

from rlcode.rollout.base import SamplingParams
from rlcode.rollout.hf_backend import HFGenerateBackend
from rlcode.rollout.openai.backend import OpenAIBackend
from rlcode.rollout.openai.client import OpenAISettings, as_settings
from rlcode.rollout.rendering import ChatPrompt, render_prompt


class RandomLegalMover:
    def act(self, envs, turns, seed: int) -> list[str]:
        rng = random.Random(seed)
        answers = []
        for env in envs:
            moves = env.legal_moves().examples()
            answers.append(_boxed(rng.choice(moves), env) if moves else "")
        return answers


class PolicyOpponent:
    def __init__(self, render: Callable, generate: Callable) -> None:
        """Answers with a model: ``render`` (messages -> prompt), ``generate`` (prompts, seed) -> rollout."""
        self.render = render
        self.generate = generate

    def act(self, envs, turns, seed: int) -> list[str]:
        return list(self.generate([self.render(turn.messages) for turn in turns], seed).completion_texts)


class LocalModelOpponent(PolicyOpponent):
    def __init__(self, model, tokenizer, params: SamplingParams, stop_token=None) -> None:
        """Answers with ``model`` (frozen, in eval mode): each turn's messages through ``tokenizer``'s chat
        template, sampled with ``params`` and the round's seed; ``stop_token``: the run's
        ``rlcode.stopping.StopToken`` (its rows end early in a collection given up on a stop)."""
        backend = HFGenerateBackend(model.requires_grad_(False).eval(), tokenizer, stop_token=stop_token)
        super().__init__(lambda messages: render_prompt(tokenizer, messages, chat=True),
                         lambda prompts, seed: backend.generate(prompts, 1, replace(params, seed=seed)))


class ServedOpponent(PolicyOpponent):
    def __init__(self, settings: OpenAISettings | dict | None, params: SamplingParams) -> None:
        """Answers with a served model: each turn's messages go to its chat endpoint (the server applies
        its own template, so no local tokenizer or weights), sampled with ``params`` and the round's seed.

        ``settings`` must use ``api: chat`` (an opponent's prompt is a conversation, not rendered text).
        """
        settings = as_settings(settings)
        if settings.api != "chat":
            raise ValueError(f"a served opponent sends chat messages: set its api to 'chat', not {settings.api!r}")
        self.backend = OpenAIBackend(settings)
        super().__init__(ChatPrompt, lambda prompts, seed: self.backend.generate(prompts, 1, replace(params, seed=seed)))


def _boxed(move: str, env) -> str:
    """Write a move the way the environment parses it (SPIRAL's ``\\boxed{}`` or a bare bracket)."""
    return f"\\boxed{{{move}}}" if getattr(env, "move_format", "boxed") == "boxed" else move

