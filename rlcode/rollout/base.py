"""The generation interface every rollout backend implements.

Prompts come in already rendered (the caller owns chat templates); each prompt is repeated
`num_generations` times consecutively, so rows i*G .. i*G+G-1 of every tensor belong to prompt i,
which is the layout group-relative advantages expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions.

    Args:
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus sampling mass (1.0 disables it).
        top_k: keep only the k most likely tokens (0 disables it).
        max_new_tokens: completion length limit; a row reaching it is marked truncated.
        stop: strings that end a completion (the string is kept in the tokens and the text).
        seed: makes sampling exactly reproducible for the same prompts and model; None draws
            from torch's global generator.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} is negative: use 0 for greedy or a positive value.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} is outside (0, 1]: use 1.0 to disable nucleus sampling.")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is negative: use 0 to disable top-k.")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} must be at least 1.")
        if any(not text for text in self.stop):
            raise ValueError("stop contains an empty string, which would stop every completion at once.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class RolloutBatch:
    """Completions and everything the loss needs, N = prompts x generations rows.

    All tensors are on the model's device.

    Attributes:
        prompt_ids: [N, P] left-padded prompt token ids.
        prompt_mask: [N, P] 1 on prompt tokens, 0 on left padding.
        completion_ids: [N, T] right-padded completion ids; pad after the last kept token.
            T <= max_new_tokens: columns that are padding in every row are dropped.
        completion_mask: [N, T] 1 up to and including EOS (or the token completing a stop string).
        completion_texts: N decoded completions, without special tokens, cut after a stop string.
        truncated: [N] bool, True when the row hit max_new_tokens without EOS or a stop string.
        num_generated_tokens: total of completion_mask (tokens that count for throughput).
        sampling_logps: [N, T] float32 log-probs the sampler gave the sampled tokens (0 on
            padding, NaN where it gave none), or None. Only samplers that may differ from the policy
            (vLLM, a served model, the HF backend's int8 copy) return them, for the
            importance-sampling correction.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    completion_texts: list[str]
    truncated: torch.Tensor
    num_generated_tokens: int
    sampling_logps: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.completion_texts)


class RolloutBackend(Protocol):
    """Anything that turns rendered prompts into a RolloutBatch."""

    def generate(self, prompts: list[str], num_generations: int, params: SamplingParams) -> RolloutBatch:
        """Sample `num_generations` completions for each prompt, grouped consecutively."""
        ...
