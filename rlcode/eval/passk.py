"""pass@k: the unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models Trained
on Code"), in its numerically stable product form."""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples, drawn without replacement from n samples of
    which c are correct, is correct: 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1..n} (1 - k/i)."""
    if not 0 <= c <= n or k < 1:
        raise ValueError(f"pass@k needs 0 <= c <= n and k >= 1, got n={n}, c={c}, k={k}")
    if k > n:
        raise ValueError(f"pass@{k} is undefined with only {n} samples")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    product = 1.0
    for i in range(n - c + 1, n + 1):
        product *= 1.0 - k / i
    return 1.0 - product


def mean_pass_at_k(counts: Mapping[object, tuple[int, int]], ks: Iterable[int]) -> dict[str, float]:
    """Mean pass@k over tasks, ``counts[task] = (n samples, c correct)``.

    A task with fewer than k samples does not enter pass@k (the estimator is undefined there), so
    pass@k averages over the tasks with n >= k; a k that no task reaches is left out of the result.
    """
    result = {}
    for k in ks:
        values = [pass_at_k(n, c, k) for n, c in counts.values() if n >= k]
        if values:
            result[f"pass@{k}"] = sum(values) / len(values)
    return result
