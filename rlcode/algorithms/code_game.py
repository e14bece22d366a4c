"""The adversarial code game on GRPO's step: one policy writes programs and predicts their output.

Each prompt (an MBPP task's text, as a theme) is played as ``num_generations`` games: the policy
writes a program (seat 0), and the policy, or a configured opponent, predicts its output (seat 1). The
rules, the validity guard and the comparison are in ``rlcode.envs.code_game``. Advantages are
group-relative per role: the writer's returns over the G programs of a prompt, the predictor's over
its G predictions (an invalid program leaves the predictor out). Every turn is trained in self-play;
with ``opponent: frozen`` (the starting policy) or ``served`` (a model behind an OpenAI-compatible
server) predicting, only the writer learns.
``reward/successful_predictions_count`` counts correct predictions in this mode.
"""

from __future__ import annotations

from typing import Literal

import torch

from rlcode.algorithms.advantages import group_advantages
from rlcode.training.frozen_policy import frozen_copy, frozen_generator
from rlcode.algorithms.grpo import GRPO
from rlcode.rollout.openai.client import OpenAISettings


class CodeGame(GRPO):
    def __init__(self, opponent: Literal["self", "frozen", "served"] = "self", invalid_program_penalty: float = -1.0,
                 program_timeout: float = 5.0, opponent_server: OpenAISettings | None = None,
                 **grpo_settings) -> None:
        """The writer/predictor game (``num_generations`` games per prompt).

        Args:
            opponent: ``"self"`` (the policy predicts too, both roles trained), ``"frozen"`` (the
                starting policy predicts) or ``"served"`` (a model behind an OpenAI-compatible server
                predicts, ``opponent_server``); with a fixed predictor only the writer learns.
            invalid_program_penalty: the writer's return for a program that is not deterministic
                and bounded (see ``rlcode.envs.code_game.check_program``).
            program_timeout: seconds each of the program's two runs may take.
            opponent_server: the served predictor's server and model (``OpenAISettings``, api chat).
            grpo_settings: the shared settings (model, sampling, loss, optimizer): see ``GRPO``.
        """
        super().__init__(**grpo_settings)
        self._opponent_policy = None  # the frozen starting policy (opponent "frozen"), off the module tree
        self._opponent_actor = None

    def configure_model(self) -> None:
        if self.policy is not None:
            return
        super().configure_model()
        if self.hparams.opponent == "frozen":
            object.__setattr__(self, "_opponent_policy", frozen_copy(self.policy))

    def _opponent(self):
        from rlcode.envs.opponents import PolicyOpponent, ServedOpponent

        if self._opponent_actor is None and self.hparams.opponent == "frozen":
            self._opponent_actor = PolicyOpponent(self.render, frozen_generator(self, self._opponent_policy))
        if self._opponent_actor is None and self.hparams.opponent == "served":
            self._opponent_actor = ServedOpponent(self.hparams.opponent_server, self.sampling_params(None))
        return self._opponent_actor

    reward_description = "writer +1 / predictor -1 when the prediction is wrong, the opposite when right"
    success_label = "predicted"  # what an episode's success means, in the step line and the summary
    success_meaning = "games whose program's output was predicted correctly"

    def _build_rewards(self):
        self._sandbox = self.sandbox_pool(2 * self.hparams.program_timeout + 5)
        return None

    def collect(self, batch):
        from rlcode.envs.code_game import CodeGameEnv
        from rlcode.envs.runner import EpisodeRunner
        from rlcode.training.turn_samples import EpisodeTurns

        hp = self.hparams
        if self._sandbox is None:
            self._build_rewards()
        envs = [CodeGameEnv(self._sandbox, theme=text, timeout=hp.program_timeout,
                            invalid_program_penalty=hp.invalid_program_penalty)
                for text in batch["text"] for _ in range(hp.num_generations)]
        seats = (0, 1) if hp.opponent == "self" else (0,)
        runner = EpisodeRunner(self.render, self.turn_generator(hp.temperature), opponent=self._opponent())
        episodes = runner.play(envs, list(range(len(envs))), [seats] * len(envs), sampling_seed=self._sampling_seed())
        return EpisodeTurns.from_episodes(episodes, self.tokenizer.pad_token_id, self.device,
                                          extra_metrics=game_metrics(episodes))

    def flat_rows(self, experience, rewards):
        return torch.zeros_like(rewards, dtype=torch.bool)  # groups are per role: see advantages

    def advantages(self, experience, rewards, totals):
        """Group-relative per role over the G games of each prompt; NaN (did not play) -> 0."""
        group = self.hparams.num_generations
        per_role = {}
        for role in (0, 1):
            returns = torch.tensor([e.returns.get(role, float("nan")) for e in experience.episodes],
                                   dtype=torch.float32)
            per_role[role], _ = group_advantages(returns, group, self.hparams.scale_rewards)
        values = [float(per_role[experience.episodes[e].turns[t].player][e]) for e, t in experience.rows]
        return torch.tensor(values, dtype=torch.float32, device=rewards.device)


def game_metrics(episodes) -> dict[str, float]:
    """Valid programs and correct predictions, as shares of the step's games."""
    count = max(len(episodes), 1)
    valid = [e for e in episodes if e.turns and e.turns[0].info.get("valid")]
    correct = sum(bool(e.success) for e in valid)
    return {"code_game/valid_program_rate": len(valid) / count,
            "code_game/correct_prediction_rate": correct / max(len(valid), 1),
            "code_game/mean_output_chars": sum(len(e.turns[0].info.get("output") or "") for e in valid)
            / max(len(valid), 1)}
