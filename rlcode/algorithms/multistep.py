"""Multi-step MBPP with execution feedback (as in ART; RLEF, arXiv 2410.02089) on GRPO's step.

Each MBPP prompt is played as G episodes of up to ``max_attempts`` answers: the code runs in the
sandbox against the tests shown, and on failure the feedback (``rlcode.envs.mbpp_feedback``) is the
next user turn. An episode's return is its final attempt's tests (binary or fraction, optionally
discounted per extra attempt, optionally with hidden tests); advantages are group-relative over the
G episodes of the same problem, and every turn of an episode shares its advantage (as in ART). Only
the model's own answers are trained, in the context of the whole conversation it saw.
"""

from __future__ import annotations


import torch

from rlcode.algorithms.advantages import group_advantages, zero_std_group_mask
from rlcode.algorithms.grpo import GRPO
from rlcode.envs.mbpp_feedback import HiddenTests, RewardKind


class MultiStepMBPP(GRPO):
    def __init__(self, max_attempts: int = 3, reward_kind: RewardKind = "binary", attempt_discount: float = 1.0,
                 hidden_tests: HiddenTests = "none", **grpo_settings) -> None:
        """GRPO over multi-attempt MBPP episodes (``num_generations`` episodes per problem).

        Args:
            max_attempts: answers per episode; a correct one ends it earlier.
            reward_kind: ``"binary"`` (every assert passes) or ``"fraction"`` of asserts passed, on
                the final attempt.
            attempt_discount: multiplies the return once per extra attempt (1.0: no discount).
            hidden_tests: ``"none"``, ``"challenge"`` (the return also needs MBPP's
                ``challenge_test_list``) or ``"held_out"`` (the last assert is never shown).
            grpo_settings: the shared settings (model, sampling, loss, optimizer): see ``GRPO``.
        """
        super().__init__(**grpo_settings)

    success_label = "solved"  # what an episode's success means, in the step line and the summary
    success_meaning = "episodes solved (every test passed) within the attempts"

    @property
    def reward_description(self) -> str:
        hp = self.hparams
        return f"MBPP tests ({hp.reward_kind}) after up to {hp.max_attempts} attempts with execution feedback"

    def _build_rewards(self):
        self._sandbox = self.sandbox_pool(self.hparams.reward_timeout)
        return None  # the episodes' returns are the rewards

    def collect(self, batch):
        from rlcode.envs.mbpp_feedback import MBPPFeedbackEnv
        from rlcode.envs.runner import EpisodeRunner
        from rlcode.training.turn_samples import EpisodeTurns

        hp = self.hparams
        if self._sandbox is None:
            self._build_rewards()
        envs = []
        for i, task_id in enumerate(batch["task_id"]):
            for _ in range(hp.num_generations):
                envs.append(MBPPFeedbackEnv(
                    self._sandbox, task_id=task_id, text=batch["text"][i], tests=batch["test_list"][i],
                    setup=batch["test_setup_code"][i] or "", entry_point=batch["entry_point"][i],
                    challenge_tests=(batch.get("challenge_test_list") or [None] * len(batch["task_id"]))[i],
                    max_attempts=hp.max_attempts, reward=hp.reward_kind, attempt_discount=hp.attempt_discount,
                    hidden_tests=hp.hidden_tests, timeout=hp.reward_timeout,
                    tags={"step": str(self.global_step), "task": str(task_id)}))
        episodes = EpisodeRunner(self.render, self.turn_generator(hp.temperature)).play(envs, list(range(len(envs))), [(0,)] * len(envs),
                                                               sampling_seed=self._sampling_seed())
        return EpisodeTurns.from_episodes(episodes, self.tokenizer.pad_token_id, self.device,
                                          extra_metrics=attempt_metrics(episodes, hp.max_attempts))

    def _episode_returns(self, experience):
        return torch.tensor([e.returns.get(0, float("nan")) for e in experience.episodes], dtype=torch.float32,
                            device=self.device)  # [P * G], prompt-major

    def flat_rows(self, experience, rewards):
        flat = zero_std_group_mask(self._episode_returns(experience), self.hparams.num_generations)
        return flat[[e for e, _ in experience.rows]] if experience.rows else flat[:0]

    def advantages(self, experience, rewards, totals):
        """Group-relative over the G episodes of each problem; every turn takes its episode's."""
        episode_advantages, _ = group_advantages(self._episode_returns(experience), self.hparams.num_generations,
                                                 self.hparams.scale_rewards)
        return episode_advantages[[e for e, _ in experience.rows]] if experience.rows else episode_advantages[:0]


def attempt_metrics(episodes, max_attempts: int) -> dict[str, float]:
    """``multistep/success_at_k`` (solved within k attempts), mean attempts, and ``fixed_rate``:
    the share of episodes whose first attempt failed that ended solved."""
    attempts = [len(e.turns) for e in episodes]
    solved = [bool(e.success) for e in episodes]
    count = max(len(episodes), 1)
    metrics = {f"multistep/success_at_{k}": sum(s and a <= k for s, a in zip(solved, attempts)) / count
               for k in range(1, max_attempts + 1)}
    first_failed = [e for e in episodes if not e.turns[0].info.get("passed_shown")]
    metrics["multistep/mean_attempts"] = sum(attempts) / count
    metrics["multistep/fixed_rate"] = (sum(bool(e.success) for e in first_failed) / len(first_failed)
                                       if first_failed else 0.0)
    metrics["multistep/successes"] = float(sum(solved))
    metrics["multistep/episodes"] = float(len(episodes))
    return metrics
