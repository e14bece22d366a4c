"""Online difficulty curriculum: spend prompts where the policy sometimes succeeds.

A GRPO group whose samples all pass, or all fail, has zero advantage: it costs a generation and
teaches nothing. The curriculum keeps, per training problem, an estimate of the policy's success
rate from the groups the step already scored, and draws the next prompts preferring problems whose
estimate is strictly between 0 and 1 ("learnable").

The rule, for each draw of ``n`` problems:

- buckets: ``unseen`` (never scored), ``stale`` (last scored ``stale_after`` or more steps ago: the
  policy has changed since), ``learnable`` (0 < estimate < 1), ``too_hard`` (estimate 0) and
  ``solved`` (estimate 1);
- ``round(explore_share * n)`` draws come from unseen and stale problems (exploration: without it
  a problem judged too hard once would never be tried again), the rest from learnable ones;
  whichever pool runs short is filled from the other, and then from every problem not yet drawn;
- within a pool, problems are drawn uniformly without replacement.

The estimate of a problem is an exponential moving average of its groups' success shares with
weight ``decay`` on the old value, so it follows the changing policy; the first observation sets it.

Distributed runs: every rank applies the same observations (all ranks' groups, in rank order) and
draws the same global batch from the same seeded generator, then takes its own slice, so the ranks
agree without further communication. The state (estimates, last-seen steps) is plain data saved in
the DataModule's checkpoint state, so a resumed run draws what the uninterrupted one would have.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Annotated

from rlcode.setting import ANY_NUMBER, COUNT, FRACTION_BELOW_ONE, PROBABILITY, check_arguments, field_of

BUCKETS = ("learnable", "unseen", "stale", "too_hard", "solved")


@dataclass
class CurriculumSettings:
    """The curriculum's knobs (``data.curriculum`` in a config; None: a seeded shuffle, no curriculum).

    Args:
        explore_share: share of each step's prompts drawn from unseen and stale problems.
        decay: weight of the old estimate when a problem is scored again (0: keep only the newest).
        stale_after: steps after which an estimate no longer counts and the problem is re-explored.
        success_threshold: a completion counts as a success when its reward is at least this
            (1.0: every test passed under ``mbpp_tests``).
    """

    explore_share: Annotated[float, field_of(PROBABILITY)] = 0.25
    decay: Annotated[float, field_of(FRACTION_BELOW_ONE)] = 0.5
    stale_after: Annotated[int, field_of(COUNT)] = 50
    success_threshold: Annotated[float, field_of(ANY_NUMBER)] = 1.0

    def __post_init__(self) -> None:
        check_arguments(CurriculumSettings, vars(self), prefix="data.curriculum.")


class Curriculum:
    def __init__(self, settings: CurriculumSettings, num_problems: int, seed: int) -> None:
        self.settings = settings
        self.num_problems = num_problems
        self.seed = seed
        self.estimates: dict[int, float] = {}  # problem index -> estimated success rate
        self.last_seen: dict[int, int] = {}  # problem index -> step it was last scored at

    # ---- learning from scored groups --------------------------------------------------------
    def observe(self, step: int, problems: list[int], success_shares: list[float]) -> None:
        """Fold in one step's groups: problem index and the share of its samples that succeeded."""
        keep = self.settings.decay
        for problem, share in zip(problems, success_shares):
            if share != share:  # NaN: the group was not scored
                continue
            old = self.estimates.get(problem)
            self.estimates[problem] = share if old is None else keep * old + (1.0 - keep) * share
            self.last_seen[problem] = step

    # ---- drawing -----------------------------------------------------------------------------
    def bucket(self, problem: int, step: int) -> str:
        if problem not in self.estimates:
            return "unseen"
        if step - self.last_seen[problem] >= self.settings.stale_after:
            return "stale"
        estimate = self.estimates[problem]
        return "too_hard" if estimate <= 0.0 else "solved" if estimate >= 1.0 else "learnable"

    def pools(self, step: int) -> dict[str, list[int]]:
        pools: dict[str, list[int]] = {name: [] for name in BUCKETS}
        for problem in range(self.num_problems):
            pools[self.bucket(problem, step)].append(problem)
        return pools

    def draw(self, step: int, n: int, salt: str = "", avoid: frozenset[int] = frozenset()) -> list[int]:
        """``n`` distinct problems for ``step`` (the same on every rank: seeded by (seed, step, salt)),
        taking problems in ``avoid`` (already drawn this step) only when nothing else is left."""
        if n > self.num_problems:
            raise ValueError(f"a step of {n} prompts needs at least {n} training problems, got {self.num_problems}")
        rng = random.Random(f"curriculum-{self.seed}-{step}{salt}")
        pools = self.pools(step)
        explore = [p for p in pools["unseen"] + pools["stale"] if p not in avoid]
        learnable = [p for p in pools["learnable"] if p not in avoid]
        wanted_explore = round(self.settings.explore_share * n)
        chosen = _sample(rng, explore, min(wanted_explore, len(explore)))
        chosen += _sample(rng, learnable, min(n - len(chosen), len(learnable)))
        rest = [p for p in range(self.num_problems) if p not in avoid]
        for pool in (explore, rest, range(self.num_problems)):  # short: more exploration, then anything
            left = [p for p in pool if p not in set(chosen)]
            chosen += _sample(rng, left, min(n - len(chosen), len(left)))
        return chosen

    def metrics(self, step: int) -> dict[str, float]:
        """Pool sizes by bucket, for the step line and W&B (``curriculum/<bucket>``)."""
        return {f"curriculum/{name}": float(len(pool)) for name, pool in self.pools(step).items()}

    # ---- checkpoint state --------------------------------------------------------------------
    def state_dict(self) -> dict:
        # Lists, not dicts with int keys: checkpoint loading may turn keys into strings.
        return {"estimates": sorted(self.estimates.items()), "last_seen": sorted(self.last_seen.items())}

    def load_state_dict(self, state: dict) -> None:
        self.estimates = {int(p): float(v) for p, v in state["estimates"]}
        self.last_seen = {int(p): int(s) for p, s in state["last_seen"]}


def _sample(rng: random.Random, pool: list[int], k: int) -> list[int]:
    return rng.sample(pool, k) if k > 0 else []


def success_shares(rewards: list[float], group_size: int, threshold: float) -> list[float]:
    """Per group (prompt-major rewards), the share of samples whose reward reaches ``threshold``
    (NaN when any sample of the group was not scored)."""
    shares = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start:start + group_size]
        if any(r != r for r in group):
            shares.append(float("nan"))
        else:
            shares.append(sum(r >= threshold for r in group) / len(group))
    return shares
