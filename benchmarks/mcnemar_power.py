"""What a before/after McNemar test on one seed could detect: the power sentence of a confirmation.

A greedy before/after comparison on the same problems only looks at the *discordant* problems (passed
before and failed after, or the reverse): with ``n`` of them, the exact two-sided test reaches
``alpha`` only when at least ``smallest_significant_gain(n)`` of them are gains. Two numbers say what
a run could have shown:

- the smallest net gain (gains minus losses) that would have been significant with the discordant
  count the run actually had;
- the chance of reaching ``alpha`` in the gain direction if each discordant problem were a gain with
  probability ``gain_share`` (the share an earlier study saw: an assumption, named where it is used),
  for the same ``n``. Conditioning on the run's own ``n`` keeps this exact (a binomial sum) instead of
  modelling how many problems flip at all.
"""

from __future__ import annotations

import math

from learning_mbpp import mcnemar_exact


def smallest_significant_gain(discordant: int, alpha: float = 0.05) -> int | None:
    """The fewest gains among ``discordant`` problems for a two-sided exact p below ``alpha`` (None: none can)."""
    for gains in range(discordant // 2, discordant + 1):
        if mcnemar_exact(discordant - gains, gains) < alpha:
            return gains
    return None


def mcnemar_power(discordant: int, gain_share: float, alpha: float = 0.05) -> float:
    """P(significant gain) when each of ``discordant`` problems is a gain with probability ``gain_share``."""
    needed = smallest_significant_gain(discordant, alpha)
    if needed is None:
        return 0.0
    return sum(math.comb(discordant, gains) * gain_share**gains * (1 - gain_share) ** (discordant - gains)
               for gains in range(needed, discordant + 1))


def power_sentence(row: dict, gain_share: float, alpha: float = 0.05) -> str:
    """One line on what ``row`` (a learning_mbpp.compare result) could detect."""
    discordant = len(row["lost"]) + len(row["gained"])
    needed = smallest_significant_gain(discordant, alpha)
    if needed is None:
        return f"{discordant} discordant problems: no split of them reaches p < {alpha}"
    return (f"{discordant} discordant problems: p < {alpha} needed at least {needed} gains (a net "
            f"{2 * needed - discordant:+d} of {row['problems']}); at a gain share of {gain_share:.2f} a seed "
            f"reaches it with probability {mcnemar_power(discordant, gain_share, alpha):.2f}")
