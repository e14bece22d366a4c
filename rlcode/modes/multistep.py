"""Multi-step MBPP with execution feedback (as in ART; RLEF, arXiv 2410.02089).

Each MBPP prompt is played as G episodes of up to ``max_attempts`` answers: the code runs in the
sandbox against the tests shown, and on failure the feedback (``rlcode.envs.mbpp_feedback``) is the
next user turn. An episode's return is its final attempt's tests (binary or fraction, optionally
discounted per extra attempt, optionally with hidden tests); advantages are group-relative over the
G episodes of the same problem (``GroupRelative``), and every turn of an episode shares its
advantage (as in ART). Only the model's own answers are trained, in the context of the whole
conversation it saw. With a curriculum (``data.curriculum``) each problem's share of solved episodes
feeds it. ``rlcode validate`` / ``test``: the greedy single-answer pass rate, as GRPO's.
"""

from __future__ import annotations

from typing import Annotated

from rlcode.algorithms.advantages import RewardScaling
from rlcode.envs.mbpp_feedback import HiddenTests, MBPPFeedbackEnv, RewardKind, require_challenge_tests
from rlcode.errors import SettingError
from rlcode.modes.curriculum_feed import curriculum_draw, curriculum_of, feed, pool_metrics
from rlcode.modes.grpo import check_groups, check_mbpp_data
from rlcode.modes.lazy_pool import LazyPool
from rlcode.modes.mbpp_pass_rate import MBPPPassRate
from rlcode.modes.opponents import play_episodes
from rlcode.setting import COUNT, POSITIVE, PROBABILITY, check_arguments, fixed, free
from rlcode.training.advantage_estimators import GroupRelative
from rlcode.training.mode import LearnerView, Mode, ModeDescription
from rlcode.training.run_context import SandboxSettings
from rlcode.training.turn_samples import EpisodeTurns


class MultiStepMBPP(Mode):
    def __init__(self,
                 max_attempts: Annotated[int, fixed(COUNT)] = 3,
                 reward_kind: Annotated[RewardKind, fixed()] = "binary",
                 attempt_discount: Annotated[float, fixed(PROBABILITY)] = 1.0,
                 hidden_tests: Annotated[HiddenTests, fixed()] = "none",
                 num_generations: Annotated[int, fixed(COUNT)] = 8,
                 scale_rewards: Annotated[RewardScaling, fixed()] = "group",
                 reward_timeout: Annotated[float, fixed(POSITIVE)] = 10.0,
                 sandbox: Annotated[SandboxSettings, free()] | None = None) -> None:
        """Multi-attempt MBPP episodes, ``num_generations`` per problem.

        Args:
            max_attempts: answers per episode; a correct one ends it earlier.
            reward_kind: ``"binary"`` (every assert passes) or ``"fraction"`` of asserts passed, on
                the final attempt.
            attempt_discount: multiplies the return once per extra attempt (1.0: no discount).
            hidden_tests: ``"none"``, ``"challenge"`` (the return also needs MBPP's
                ``challenge_test_list``) or ``"held_out"`` (the last assert is never shown).
            num_generations: G, episodes per problem (the group of the advantage's baseline).
            scale_rewards: divide advantages by the "group" std, the "batch" std (every rank's
                episodes), or "none".
            reward_timeout: seconds each answer may run in the sandbox (also in validate / test).
            sandbox: how the sandbox runs the code (``SandboxSettings``); None: the defaults.
        """
        check_arguments(MultiStepMBPP, locals(), prefix="model.mode.")  # Python callers; the CLI checked before building
        check_groups(num_generations, scale_rewards)
        self.max_attempts, self.reward_kind, self.attempt_discount = max_attempts, reward_kind, attempt_discount
        self.hidden_tests, self.num_generations, self.scale_rewards = hidden_tests, num_generations, scale_rewards
        self.reward_timeout, self.sandbox = reward_timeout, sandbox or SandboxSettings()
        self.estimator = GroupRelative(num_generations, scale_rewards)
        self.evaluation = MBPPPassRate(reward_timeout)
        self._sandbox = LazyPool(reward_timeout)
        self._metrics: dict[str, float] = {}

    def check_data(self, datamodule) -> None:
        check_mbpp_data(self, datamodule)
        train_tasks = getattr(datamodule, "train_tasks", None)  # loaded for fit only (evaluation shows every test)
        if self.hidden_tests == "challenge" and train_tasks:
            try:
                require_challenge_tests(train_tasks, getattr(datamodule, "train_split", "train"))
            except ValueError as error:  # one line from `rlcode fit`, no traceback
                raise SettingError(f"model.mode.init_args.{error}") from None

    def setup(self, learner: LearnerView, stage: str) -> None:
        if stage == "fit":
            self._sandbox.get(learner)

    def teardown(self) -> None:
        self._sandbox.close()
        self.evaluation.close()

    def collect(self, learner: LearnerView, batch) -> EpisodeTurns:
        pool = self._sandbox.get(learner)
        count = len(batch["task_id"])
        challenges = batch.get("challenge_test_list") or [None] * count
        envs = [MBPPFeedbackEnv(
            pool, task_id=task_id, text=batch["text"][i], tests=batch["test_list"][i],
            setup=batch["test_setup_code"][i] or "", entry_point=batch["entry_point"][i],
            challenge_tests=challenges[i], max_attempts=self.max_attempts, reward=self.reward_kind,
            attempt_discount=self.attempt_discount, hidden_tests=self.hidden_tests, timeout=self.reward_timeout,
            tags={"step": str(learner.global_step), "task": str(task_id)})
            for i, task_id in enumerate(batch["task_id"]) for _ in range(self.num_generations)]
        self._metrics = pool_metrics(learner, batch)
        episodes, _ = play_episodes(learner, envs, list(range(len(envs))), [(0,)] * len(envs))
        if curriculum_of(learner) is not None:  # the episodes are scored already: no wait is added
            group = self.num_generations
            shares = [sum(bool(e.success) for e in episodes[i * group:(i + 1) * group]) / group for i in range(count)]
            feed(learner, curriculum_draw(batch), list(batch["task_id"]), shares, capacity=count)
        return EpisodeTurns.from_episodes(episodes, learner.pad_token_id(), learner.device)

    def step_metrics(self, experience: EpisodeTurns) -> dict[str, float]:
        return {**attempt_metrics(experience.episodes, self.max_attempts), **self._metrics}

    def validation_step(self, learner, batch, batch_idx):
        return self.evaluation.step(learner, batch, batch_idx, testing=False)

    def test_step(self, learner, batch, batch_idx):
        return self.evaluation.step(learner, batch, batch_idx, testing=True)

    def description(self) -> ModeDescription:
        return ModeDescription(
            rewards=[f"MBPP tests ({self.reward_kind}) after up to {self.max_attempts} attempts with execution feedback"],
            group_size=self.num_generations, success_label="solved",
            success_meaning="episodes solved (every test passed) within the attempts")


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
