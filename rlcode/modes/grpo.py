"""GRPO on MBPP: G completions per prompt, scored by reward functions in the sandbox, advantages
relative to the group.

    prompts -> G completions each -> rewards (started, running in the sandbox pool)
            -> group-relative advantages (GroupRelative) -> the Learner's update

``rlcode validate`` / ``test``: the greedy pass rate on MBPP or HumanEval (``MBPPPassRate``).
"""

from __future__ import annotations

from rlcode.algorithms.advantages import RewardScaling
from rlcode.errors import SettingError
from rlcode.modes.mbpp_pass_rate import MBPPPassRate
from rlcode.rewards.factory import build_rewards
from rlcode.rewards.mixture import RewardMixture
from rlcode.training.advantage_estimators import GroupRelative
from rlcode.training.experience import CompletionGroups, repeat_each
from rlcode.training.mode import LearnerView, Mode, ModeDescription
from rlcode.training.run_context import SandboxSettings

REWARD_COLUMNS = ("task_id", "test_list", "test_setup_code", "entry_point")


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
    def __init__(self, rewards: list[str] = ["execution"],  # noqa: B006 (jsonargparse needs the literal default)
                 reward_weights: list[float] | None = None, reward_timeout: float = 10.0, num_generations: int = 8,
                 scale_rewards: RewardScaling = "group", sandbox: SandboxSettings | None = None) -> None:
        """Group Relative Policy Optimization on MBPP with reward functions.

        Args:
            rewards: reward function names from ``rlcode.rewards`` ("execution", "mbpp_tests",
                "mbpp_tests_fraction") or import paths "package.module:function" of TRL-style
                functions, summed with ``reward_weights``.
            reward_weights: one weight per reward (None: all 1.0).
            reward_timeout: seconds each completion may run in the sandbox (also in validate / test).
            num_generations: G, completions sampled per prompt (the group of GRPO's baseline).
            scale_rewards: divide advantages by the "group" std, the "batch" std (every rank's), or "none".
            sandbox: how the sandbox runs the code (``SandboxSettings``: workers,
                allow_visible_filesystem); None: the defaults.
        """
        check_groups(num_generations, scale_rewards)
        self.rewards, self.reward_weights, self.reward_timeout = list(rewards), reward_weights, reward_timeout
        self.num_generations, self.scale_rewards = num_generations, scale_rewards
        self.sandbox = sandbox or SandboxSettings()
        self.estimator = GroupRelative(num_generations, scale_rewards)
        self.reward_mixture: RewardMixture | None = None
        self._sandbox = None  # the rewards' pool
        self.evaluation = MBPPPassRate(reward_timeout)

    def check_data(self, datamodule) -> None:
        check_mbpp_data(self, datamodule)

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
        """G completions per MBPP prompt (prompt-major), their rewards started in the sandbox."""
        group = self.num_generations
        prompts = [learner.render(p) for p in batch["prompt"]]
        rollout = learner.generate(prompts, group, seed=learner.sampling_seed())
        columns = {name: repeat_each(batch[name], group) for name in REWARD_COLUMNS if name in batch}
        columns["step"] = learner.global_step  # tags the sandbox executions of this step
        job = self.reward_mixture.start(repeat_each(prompts, group), rollout.completion_texts, **columns)
        return CompletionGroups(rollout, prompts, list(batch["task_id"]), group, job)

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
