"""The settings an eval generated and judged with, recorded in every verdict file.

The fit-time MBPP eval (``eval.*``) and ``rlcode validate`` / ``test`` resolve them the same way
(``resolve``), so a base model scored at fit start and a checkpoint scored by ``rlcode test`` see the
same token limit, prompt format, sampling and timeout. Each verdict file carries them under
``"generation"``; ``differing`` names the first that differs between two files, so a before/after
comparison of evals scored unalike is refused (``benchmarks/learning_mbpp.py``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

# Greedy completions do not depend on the batch size (tests/test_eval_batching.py); sampled ones do,
# because each generated batch draws its own seed. Compared only when the evals sampled.
SAMPLING_ONLY = ("batch_size",)


@dataclass(frozen=True)
class EvalSettings:
    max_new_tokens: int
    temperature: float
    """Of the pass@k samples (the greedy pass@1 is at 0)."""
    num_samples: int
    k: tuple[int, ...]
    timeout: float
    """Seconds each program may run in the sandbox."""
    batch_size: int
    prompt_format: str
    model_name: str
    precision: str
    rollout_backend: str
    stop: tuple[str, ...]

    def as_json(self) -> dict:
        return {**asdict(self), "k": list(self.k), "stop": list(self.stop)}


def resolve(module, datamodule, *, max_new_tokens: int | None, temperature: float, num_samples: int,
            k: Sequence[int], timeout: float, batch_size: int | None) -> EvalSettings:
    """The eval callback's settings with their defaults filled from the model and the data, as the
    fit-time eval resolves them (None token limit: the model's; None batch size: the data's)."""
    hp = module.hparams
    return EvalSettings(
        max_new_tokens=max_new_tokens or hp.max_new_tokens, temperature=float(temperature),
        num_samples=num_samples, k=tuple(x for x in k if x <= num_samples), timeout=float(timeout),
        batch_size=batch_size or datamodule.resolved_eval_batch_size(),
        prompt_format=getattr(datamodule, "prompt_format", "chat"), model_name=str(getattr(hp, "model_name", "")),
        precision=str(getattr(hp, "precision", "")), rollout_backend=str(getattr(hp, "rollout_backend", "hf")),
        stop=tuple(getattr(hp, "stop", None) or ()))


def differing(first: dict | None, second: dict | None) -> str | None:
    """The first setting two verdict files' ``"generation"`` records differ in, as
    ``"name (a vs b)"``; None when they agree. A file that records none (written before they were
    recorded, or by a scorer that does not know them) is compared as given: there is nothing to tell."""
    if not first or not second:
        return None
    sampled = first.get("num_samples", 0) or second.get("num_samples", 0)
    for name in sorted(set(first) | set(second)):
        if name in SAMPLING_ONLY and not sampled:
            continue
        if first.get(name) != second.get(name):
            return f"{name} ({first.get(name)!r} vs {second.get(name)!r})"
    return None
