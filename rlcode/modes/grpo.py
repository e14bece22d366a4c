"""GRPO on MBPP: G completions per prompt, scored by reward functions in the sandbox, advantages
relative to the group.

    prompts -> G completions each -> rewards (started, running in the sandbox pool)
            -> group-relative advantages (GroupRelative) -> the Learner's update

With a curriculum (``data.curriculum``) each step's groups feed it their success shares once the
rewards are known; with ``dynamic_sampling`` flat groups are replaced by groups drawn in further
generation rounds (``rlcode.training.dynamic_sampling``).

``rlcode validate`` / ``test``: the greedy pass rate on MBPP or HumanEval (``MBPPPassRate``).
"""

from __future__ import annotations

import hashlib
from typing import Annotated

from rlcode.algorithms.advantages import RewardScaling
from rlcode.data.curriculum import success_shares
from rlcode.errors import SettingError
from rlcode.modes.curriculum_feed import FeedOnResult, curriculum_draw, curriculum_of, feed, pool_metrics
from rlcode.modes.mbpp_pass_rate import MBPPPassRate
from rlcode.rewards.factory import build_rewards
from rlcode.rewards.mixture import RewardMixture
from rlcode.setting import COUNT, NON_NEGATIVE, POSITIVE, check_arguments, fixed, free
from rlcode.training.advantage_estimators import GroupRelative
from rlcode.training.dynamic_sampling import DynamicSampling, with_signal
from rlcode.training.experience import CompletionGroups, repeat_each
from rlcode.training.mode import LearnerView, Mode, ModeDescription
from rlcode.training.run_context import SandboxSettings

# hidden_tests: present when their cache is built (rlcode.data.hidden_tests), for mbpp_hidden_tests
REWARD_COLUMNS = ("task_id", "test_list", "test_setup_code", "entry_point", "hidden_tests")


def check_groups(num_generations: int, scale_rewards: str) -> None:
    if num_generations < 2 and scale_rewards == "group":
        raise ValueError("num_generations=1 gives every group a zero std (no learning signal): "
                         "use num_generations >= 2")


def check_mbpp_data(mode: Mode, datamodule) -> None:
    """The modes that write code read MBPP's columns (task_id, text, test_list, ...)."""
    if hasattr(datamodule, "games"):
        raise SettingError(f"{type(mode).__name__} trains on MBPP problems, not games: use data.class_path "
                           f"rlcode.data.datamodule.MBPPDataModule (or the mode rlcode.modes.SPIRAL for games)")


class GRPO(Mode):
    def __init__(self,
                 rewards: Annotated[list[str], fixed()] = ["execution"],  # noqa: B006 (jsonargparse needs the literal default)
                 reward_weights: Annotated[list[float], fixed(NON_NEGATIVE)] | None = None,
                 reward_timeout: Annotated[float, fixed(POSITIVE)] = 10.0,
                 num_generations: Annotated[int, fixed(COUNT)] = 8,
                 scale_rewards: Annotated[RewardScaling, fixed()] = "group",
                 sandbox: Annotated[SandboxSettings, free()] | None = None,
                 dynamic_sampling: Annotated[DynamicSampling, fixed()] | None = None) -> None:
        """Group Relative Policy Optimization on MBPP with reward functions.

        Args:
            rewards: reward function names from ``rlcode.rewards`` ("execution", "mbpp_tests",
                "mbpp_tests_fraction", "mbpp_hidden_tests", "mbpp_hidden_tests_fraction") or import
                paths "package.module:function" of TRL-style functions, summed with ``reward_weights``.
            reward_weights: one weight per reward (None: all 1.0).
            reward_timeout: seconds each completion may run in the sandbox (also in validate / test).
            num_generations: G, completions sampled per prompt (the group of GRPO's baseline).
            scale_rewards: divide advantages by the "group" std, the "batch" std (every rank's), or "none".
            sandbox: how the sandbox runs the code (``SandboxSettings``: workers,
                allow_visible_filesystem); None: the defaults.
            dynamic_sampling: when groups come back flat (all rewards equal: advantage 0, nothing
                learnt from their generation), draw further prompts and generate again until the
                step has its number of groups with signal, up to ``max_extra_rounds`` extra rounds
                (DAPO's dynamic sampling). Costs generation time on steps with flat groups; the
                rewards are then awaited during the step's generation. None: off, one round.
        """
        check_arguments(GRPO, locals(), prefix="model.mode.")  # Python callers; the CLI checked before building
        check_groups(num_generations, scale_rewards)
        self.rewards, self.reward_weights, self.reward_timeout = list(rewards), reward_weights, reward_timeout
        self.num_generations, self.scale_rewards = num_generations, scale_rewards
        self.sandbox = sandbox or SandboxSettings()
        self.dynamic_sampling = dynamic_sampling
        self.estimator = GroupRelative(num_generations, scale_rewards)
        self.reward_mixture: RewardMixture | None = None
        self._sandbox = None  # the rewards' pool
        self.evaluation = MBPPPassRate(reward_timeout)
        self._metrics: dict[str, float] = {}

    def check_data(self, datamodule) -> None:
        check_mbpp_data(self, datamodule)
        if self.dynamic_sampling is not None and not hasattr(datamodule, "extra_batch"):
            raise SettingError(f"model.mode.init_args.dynamic_sampling draws further prompts from the DataModule, "
                               f"which {type(datamodule).__name__} cannot give: use rlcode.data.datamodule.MBPPDataModule "
                               "or leave dynamic_sampling unset")

    def setup(self, learner: LearnerView, stage: str) -> None:
        if stage == "fit" and self.reward_mixture is None:
            functions, self._sandbox = build_rewards(self.rewards, timeout=self.reward_timeout,
                                                     pool_factory=learner.sandbox_pool, run_id=learner.run_tag())
            self.reward_mixture = RewardMixture(functions, self.reward_weights)

    def teardown(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox, self.reward_mixture = None, None
        self.evaluation.close()

    def collect(self, learner: LearnerView, batch) -> CompletionGroups:
        """G completions per MBPP prompt (prompt-major), their rewards started in the sandbox; with
        dynamic sampling, topped up from further rounds while groups are flat (rewards awaited here)."""
        seed = learner.sampling_seed()
        self._metrics = pool_metrics(learner, batch)
        first = self._groups(learner, batch, seed)
        if self.dynamic_sampling is None:
            rounds, groups = [first], first
        else:
            rounds = [first]
            datamodule = learner.datamodule()
            epoch, draw = batch.get("position", (0, learner.global_step))

            def more(round_: int) -> CompletionGroups:
                drawn = [t for r in rounds for t in r.task_ids]
                extra = datamodule.extra_batch(draw, round_, epoch=epoch, drawn=drawn)
                rounds.append(self._groups(learner, extra, extra_round_seed(seed, round_)))
                return rounds[-1]

            groups = with_signal(first, more, self.dynamic_sampling, learner.pad_token_id())
        if curriculum_of(learner) is not None:
            def on_outcome(outcome) -> None:
                self._feed(learner, curriculum_draw(batch), rounds, groups, outcome)

            if groups.outcome is not None:  # awaited by dynamic sampling: nothing left to overlap
                on_outcome(groups.outcome)
            else:
                groups.job = FeedOnResult(groups.job, on_outcome)
        return groups

    def _groups(self, learner: LearnerView, batch, seed: int) -> CompletionGroups:
        group = self.num_generations
        prompts = [learner.render(p) for p in batch["prompt"]]
        rollout = learner.generate(prompts, group, seed=seed)
        columns = {name: repeat_each(batch[name], group) for name in REWARD_COLUMNS if name in batch}
        columns["step"] = learner.global_step  # tags the sandbox executions of this step
        job = self.reward_mixture.start(repeat_each(prompts, group), rollout.completion_texts, **columns)
        return CompletionGroups(rollout, prompts, list(batch["task_id"]), group, job)

    def _feed(self, learner: LearnerView, draw: int, rounds: list[CompletionGroups], groups: CompletionGroups,
              outcome) -> None:
        """Every group scored this step (each round's, with dynamic sampling) -> the curriculum."""
        threshold = curriculum_of(learner).settings.success_threshold
        # one round: this step's groups; more: every round's, those the step did not keep included
        scored = [(groups.task_ids, outcome.total)] if len(rounds) == 1 else [(r.task_ids, r.outcome.total) for r in rounds]
        task_ids = [t for ids, _ in scored for t in ids]
        shares = [s for _, total in scored for s in success_shares(total, self.num_generations, threshold)]
        extra_rounds = self.dynamic_sampling.max_extra_rounds if self.dynamic_sampling is not None else 0
        feed(learner, draw, task_ids, shares, capacity=len(rounds[0].task_ids) * (1 + extra_rounds))

    def step_metrics(self, experience) -> dict[str, float]:
        return dict(self._metrics)

    def validation_step(self, learner, batch, batch_idx):
        return self.evaluation.step(learner, batch, batch_idx, testing=False)

    def test_step(self, learner, batch, batch_idx):
        return self.evaluation.step(learner, batch, batch_idx, testing=True)

    def description(self) -> ModeDescription:
        return ModeDescription(rewards=list(self.rewards), group_size=self.num_generations)

    def state_dict(self):
        return {**super().state_dict(),
                "rewards": self.reward_mixture.state_dict() if self.reward_mixture is not None else {}}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        if self.reward_mixture is not None and state.get("rewards"):
            self.reward_mixture.load_state_dict(state["rewards"])


def extra_round_seed(step_seed: int, round_: int) -> int:
    """The sampling seed of dynamic sampling's round ``round_`` (1, 2, ...) of a step: a function of
    the step's and rank's seed and the round, so a resumed run samples the same. Hashed (56 bits), so
    it does not coincide with another step's or rank's seed as an affine mix of small numbers would."""
    digest = hashlib.blake2b(f"dynamic-sampling-{step_seed}-{round_}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "big")
