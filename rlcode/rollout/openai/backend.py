"""Rollouts from a model behind an OpenAI-compatible server (``rollout_backend: openai``).

Tested against llama.cpp's server (``llama-cpp-python[server]==0.3.36``) with the embedded SmolLM2
GGUF; written to vLLM's and OpenAI's documented request fields as well.

Which endpoint, and why:

- ``api: chat`` (default) sends the conversation to ``/v1/chat/completions``; the server applies its
  own model's chat template. That is what a served OpenAI model needs (it has no completions
  endpoint for chat models) and it needs no local tokenizer, so a dry run, a served opponent or an
  evaluation loads nothing locally. The trainer then never learns the prompt's tokens, so chat
  rollouts cannot be trained on.
- ``api: completions`` sends the prompt the trainer rendered with its own chat template (as token
  ids when ``token_ids`` is on, text otherwise) to ``/v1/completions``: the trainer knows every
  prompt token, which training needs.

Training also needs the sampled token ids, which only vLLM returns (``return_tokens_as_token_ids``);
a server that gives only token text (llama.cpp, OpenAI) can serve dry runs, opponents and evaluation
(``training_unsupported_reason`` says why not training). The served weights never receive the
trainer's updates: with vLLM and ids, training is off-policy from the served model, corrected by the
truncated importance weight against the server's log-probs (``importance_sampling_cap``).

Where ids are unknown, the batch holds the right number of pad tokens per completion (from the
log-probs or the server's usage count), so lengths and throughput metrics still mean something.
"""

from __future__ import annotations

import torch

from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.rollout.base import RolloutBatch, SamplingParams
from rlcode.rollout.openai.client import OpenAIClient, OpenAISettings, SampleRequest, ServedCompletion, as_settings
from rlcode.rollout.rendering import ChatPrompt

OPENAI_STOP_LIMIT = 4  # OpenAI refuses more stop strings


class OpenAIBackend:
    """Generate completions with a served model.

    Args:
        settings: the server, model and request settings (``OpenAISettings``; None: defaults and
            the environment).
        tokenizer: the trainer's tokenizer, used with ``api: completions`` to know the prompt
            tokens (None: prompts are sent as text and their ids are unknown).
    """

    def __init__(self, settings: OpenAISettings | dict | None = None, tokenizer=None) -> None:
        self.settings = as_settings(settings)
        self.tokenizer = tokenizer
        self.client = OpenAIClient(self.settings)
        self.pad_token_id = getattr(tokenizer, "pad_token_id", None) or 0

    @property
    def renders_chat(self) -> bool:
        """True when prompts should stay messages (``ChatPrompt``): the server applies the template."""
        return self.settings.api == "chat"

    @property
    def importance_sampling_cap(self) -> float | None:
        """The policy update's importance-weight cap (the server's weights are not the trainer's)."""
        return self.settings.importance_sampling_cap if self.training_unsupported_reason() is None else None

    def training_unsupported_reason(self) -> str | None:
        """Why these rollouts cannot be trained on, or None when they can."""
        if self.settings.api == "chat":
            return ("api 'chat' lets the server apply the chat template, so the prompt tokens are unknown "
                    "(set openai.api completions)")
        if not self.settings.token_ids:
            return ("the sampled token ids are not requested (openai.token_ids true; only vLLM's server "
                    "returns them, llama.cpp's and OpenAI's do not)")
        if self.tokenizer is None:
            return "no local tokenizer to encode the prompts"
        return None

    def generate(self, prompts: list[str], num_generations: int, params: SamplingParams) -> RolloutBatch:
        """Sample `num_generations` completions per prompt; rows i*G..i*G+G-1 belong to prompt i."""
        if not prompts:
            raise ValueError("generate() got no prompts.")
        if num_generations < 1:
            raise ValueError(f"num_generations={num_generations} must be at least 1.")
        if len(params.stop) > OPENAI_STOP_LIMIT:
            raise ValueError(f"{len(params.stop)} stop strings: OpenAI-compatible servers take at most "
                             f"{OPENAI_STOP_LIMIT}; shorten model.stop")
        if not self.renders_chat and any(isinstance(prompt, ChatPrompt) for prompt in prompts):
            raise ValueError("openai api 'completions' got chat messages, not a rendered prompt: use api 'chat' (the "
                             "server applies its template) or render them with the trainer's tokenizer")
        prompt_ids = [self._prompt_ids(prompt) for prompt in prompts]
        payloads = [self._payload(prompt, ids) for prompt, ids in zip(prompts, prompt_ids)]
        # Greedy samples are all the same: ask once per prompt and repeat (as the vLLM backend does).
        per_prompt = 1 if params.greedy else num_generations
        requests = [_request(payload, params, seed_offset=i * per_prompt + j)
                    for i, payload in enumerate(payloads) for j in range(per_prompt)]
        answers = self.client.complete(requests)
        rows = [answers[i * per_prompt + (0 if params.greedy else j)]
                for i in range(len(prompts)) for j in range(num_generations)]
        return self._batch(rows, [ids for ids in prompt_ids for _ in range(num_generations)])

    def _prompt_ids(self, prompt: str) -> list[int] | None:
        if self.renders_chat or self.tokenizer is None:
            return None
        return list(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])

    def _payload(self, prompt: str, ids: list[int] | None):
        if self.renders_chat:
            return ChatPrompt(prompt).messages
        # Token ids make the server continue exactly the tokens the trainer scores (no second BOS).
        return ids if ids is not None and self.settings.token_ids else str(prompt)

    def _batch(self, rows: list[ServedCompletion], prompt_ids: list[list[int] | None]) -> RolloutBatch:
        pad = self.pad_token_id
        completion_ids = [row.token_ids if row.token_ids is not None else [pad] * row.num_tokens for row in rows]
        prompts = [ids if ids is not None else [pad] * (row.prompt_tokens or 0) for ids, row in zip(prompt_ids, rows)]
        logps = [row.logprobs for row in rows]
        aligned = all(values is not None and len(values) == len(ids) for values, ids in zip(logps, completion_ids))
        return batch_from_token_lists(
            prompt_ids=prompts, completion_ids=completion_ids, ended=[not row.truncated for row in rows],
            completion_texts=[row.text for row in rows], pad_token_id=pad, device=torch.device("cpu"),
            sampling_logps=logps if aligned else None)


def _request(payload, params: SamplingParams, seed_offset: int) -> SampleRequest:
    # Each sample its own seed: servers seed a request, not each sample of a group.
    seed = None if params.seed is None else params.seed + seed_offset
    return SampleRequest(prompt=payload, max_tokens=params.max_new_tokens, temperature=params.temperature,
                         top_p=params.top_p, top_k=params.top_k, stop=tuple(params.stop), seed=seed)

