"""How a training module gets its rollouts: prompts rendered for its backend, G completions per
prompt on the policy's device, the backend's copy of the weights kept current (vLLM), and the one
case without local weights (a dry run against a served model).

A mixin of ``Learner``: it uses ``self.backend``, ``self.tokenizer``, ``self.policy`` and ``hparams``.
"""

from __future__ import annotations

import dataclasses

from rlcode.models import load_tokenizer
from rlcode.rollout import render_prompt
from rlcode.rollout.openai.backend import OpenAIBackend
from rlcode.rollout.openai.client import as_settings
from rlcode.rollout.rendering import ChatPrompt

_ROLLOUT_TENSORS = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated")


class PolicyRollouts:
    def render(self, prompt) -> str:
        """Chat messages through the tokenizer's chat template; plain text as it is. A backend whose
        server applies the template (openai, api chat) gets the messages as a ``ChatPrompt``."""
        if getattr(self.backend, "renders_chat", False):
            return ChatPrompt(prompt)
        return render_prompt(self.tokenizer, prompt, chat=isinstance(prompt, list))

    def generate(self, prompts: list[str], num_generations: int, *, temperature: float | None = None,
                 max_new_tokens: int | None = None, seed: int | None = None, precision: str | None = None):
        """G completions per rendered prompt (prompt-major; ``temperature`` None: the training one); the
        backend switches to eval mode. ``precision`` ("same", "int8"; None: ``rollout_precision``) picks
        the sampler of the hf backend (an eval may sample in full precision while training uses int8)."""
        params = self.sampling_params(seed, temperature, max_new_tokens)
        rollout = self.backend.generate(prompts, num_generations, params, **self._precision_argument(precision))
        # The HF backend decodes under inference_mode, and autograd refuses such tensors as inputs;
        # vLLM returns CPU tensors. The loss gets ordinary copies on the policy's device.
        return dataclasses.replace(rollout, **{name: getattr(rollout, name).to(self.device, copy=True)
                                               for name in _ROLLOUT_TENSORS})

    def _precision_argument(self, precision: str | None) -> dict:
        """The backend's ``precision`` keyword: only the hf backend has one; others sample as they do."""
        if precision is None or not hasattr(self.backend, "rollout_precision"):
            if precision == "int8":
                raise ValueError(f"rollout_precision int8 samples with the 'hf' backend only, not "
                                 f"{self.hparams.rollout_backend!r}: use rollout_precision same")
            return {}
        return {"precision": precision}

    def turn_generator(self, temperature: float | None = None, precision: str | None = None):
        """(rendered prompts, seed) -> one completion each from the policy: what the episode runner calls
        (``temperature`` None: the training one; ``precision`` None: the training sampler)."""
        temperature = self.hparams.temperature if temperature is None else temperature
        return lambda prompts, seed: self.generate(prompts, 1, temperature=temperature, seed=seed, precision=precision)

    def model_description(self) -> str:
        """What samples the rollouts, for the run's banner: the model name, or the served model and its server."""
        client = getattr(self.backend, "client", None)
        if client is None:
            return str(self.hparams.model_name)
        trained = "" if self.policy is None else f" (trained: {self.hparams.model_name})"
        return f"{client.model()} served at {client.base_url}{trained}"

    def served_dry_run(self) -> bool:
        """A dry run sampling from a served model: no local weights are needed (ART's --dry-run --use-openai)."""
        return self.hparams.rollout_backend == "openai" and self.hparams.dry_run

    def _configure_served_dry_run(self) -> None:
        settings = as_settings(self.hparams.openai)
        # Chat: the server applies its template, nothing is loaded here. Completions: the trainer renders
        # the prompt, which takes the tokenizer (never the weights).
        self.tokenizer = None if settings.api == "chat" else load_tokenizer(self.hparams.model_name)
        self.backend = OpenAIBackend(settings, self.tokenizer)

    def _weights_changed(self) -> None:
        # vLLM, and the hf backend's int8 sampler, hold their own copy of the weights: it is made again
        # from the policy's before the next generate.
        if callable(getattr(self.backend, "weights_changed", None)):
            self.backend.weights_changed()
