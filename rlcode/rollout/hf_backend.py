"""Rollouts with a Hugging Face model in this process, through a lean decoding loop.

Why not `model.generate()`: its multinomial sampling dominates a small model's step on CPU, one
looping row keeps the whole batch running to the token limit, and stop strings cost a full-batch
check. This loop samples with Gumbel-max, drops finished rows from the KV cache so the remaining
ones run on a smaller batch, encodes each distinct prompt once and copies its cache G times, then
gives the cache room for the whole completion so each step writes in place (``kv_cache``). Each
step copies the sampled tokens to the host once and decides there which rows ended; a row's tail is
decoded for stop strings only when its newest token could complete one.

With ``rollout_precision="int8"`` the loop runs an int8 copy of the policy (``quantized_sampler``),
rebuilt after ``weights_changed()``, and records its log-probs of the sampled tokens
(``sampling_logps``) for the importance-sampling correction.

Given the run's ``StopToken``, the loop ends every live row at the next token once a stop signal
reached this process during a training step's collection (``StopToken.ends_rows``): this rank's own
answer, which cannot set the ranks apart (the loop runs no collective, and the step asks the ranks
at ``StopPoint.AFTER_COLLECT`` before any row is used; see ``rlcode.stopping``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlcode.algorithms.importance_correction import DEFAULT_CAP
from rlcode.models.cache_name import cache_argument, output_cache
from rlcode.models.sharding import gathered
from rlcode.rollout.assembly import batch_from_token_lists
from rlcode.rollout.base import RolloutBatch, SamplingParams
from rlcode.rollout.cast_once import weights_cast_once
from rlcode.rollout.kv_cache import preallocate
from rlcode.rollout.llama_decode_step import llama_decode_step, runs_llama_decode_step
from rlcode.rollout.quantized_sampler import QuantizedSampler, RolloutPrecision, precision_refusal, sampling_logps
from rlcode.rollout.sampling import next_tokens
from rlcode.rollout.shared_prompt_cache import SharedPromptStep, share_prompt_cache, shares_prompt_cache
from rlcode.rollout.stop_strings import StopStringMatcher
from rlcode.stopping import StopToken


@dataclass
class _Decoded:
    """What the sampling loop produced, before masks and texts are derived from it."""

    completion_ids: torch.Tensor  # [N, max_new_tokens], pad where nothing was generated
    lengths: torch.Tensor  # [N] kept tokens per row (CPU)
    ended: torch.Tensor  # [N] EOS or a stop string seen (CPU)
    stopped_by_string: torch.Tensor  # [N] (CPU)
    sampling_logps: torch.Tensor | None = None  # [N, max_new_tokens] the sampler's, when recorded


class HFGenerateBackend:
    """Generate completions with a transformers causal LM (plain or peft-wrapped).

    Args:
        model: the policy; generation runs without gradients in eval mode and the previous
            train/eval mode is restored afterwards.
        tokenizer: its tokenizer; needs a pad token (see `rlcode.models.load_tokenizer`).
        eos_token_ids: ids that end a completion; default: the tokenizer's eos plus the model's
            generation_config eos ids.
        add_special_tokens: let the tokenizer add BOS etc. when encoding prompts; off by default
            because chat templates already contain them.
        rollout_precision: "same" (sample from the model itself) or "int8" (from an int8 copy, on CPU,
            with its log-probs recorded); ``generate(precision=...)`` may choose per call.
        stop_token: the run's ``rlcode.stopping.StopToken`` (None: rows never end early).
    """

    def __init__(
        self,
        model,
        tokenizer,
        eos_token_ids: Sequence[int] | None = None,
        add_special_tokens: bool = False,
        rollout_precision: RolloutPrecision = "same",
        stop_token: StopToken | None = None,
    ) -> None:
        refusal = precision_refusal(rollout_precision, "hf", None)
        if refusal is not None:
            raise ValueError(refusal)
        if tokenizer.pad_token_id is None:
            raise ValueError("The tokenizer has no pad token: load it with rlcode.models.load_tokenizer.")
        self.model = model
        self.tokenizer = tokenizer
        self.eos_token_ids = sorted(set(eos_token_ids if eos_token_ids is not None else default_eos_token_ids(model, tokenizer)))
        if not self.eos_token_ids:
            raise ValueError("No EOS token id found on the tokenizer or the model: pass eos_token_ids.")
        self.add_special_tokens = add_special_tokens
        self._cache_keyword = cache_argument(model)  # read once: every decode step passes the cache by it
        self._stop_matchers: dict[tuple[str, ...], StopStringMatcher] = {}
        self.rollout_precision = rollout_precision
        self._quantized: QuantizedSampler | None = None  # built at the first int8 generate
        self.stop_token = stop_token

    @property
    def importance_sampling_cap(self) -> float | None:
        """The update's cap of the truncated importance weights: on when training samples from int8."""
        return DEFAULT_CAP if self.rollout_precision == "int8" else None

    def weights_changed(self) -> None:
        """The policy was updated: the int8 copy is rebuilt before its next use."""
        if self._quantized is not None:
            self._quantized.weights_changed()

    def take_refresh_seconds(self) -> float | None:
        """Seconds spent rebuilding the int8 copy since the last call (None: no rebuild)."""
        return None if self._quantized is None else self._quantized.take_refresh_seconds()

    def generate(self, prompts: list[str], num_generations: int, params: SamplingParams,
                 precision: RolloutPrecision | None = None) -> RolloutBatch:
        """Sample `num_generations` completions per prompt; rows i*G..i*G+G-1 belong to prompt i.

        ``precision`` None: the backend's ``rollout_precision``."""
        if not prompts:
            raise ValueError("generate() got no prompts.")
        if num_generations < 1:
            raise ValueError(f"num_generations={num_generations} must be at least 1.")
        if (precision or self.rollout_precision) == "int8":
            if self._quantized is None:
                self._quantized = QuantizedSampler(self.model)
            with torch.no_grad():
                return self._generate(self._quantized.model(), prompts, num_generations, params)
        was_training = self.model.training
        self.model.eval()
        try:
            # no_grad, not inference_mode: inference tensors could not be fed to the loss's
            # forward pass (embedding backward saves the token ids). A sharded (FSDP2) model is
            # gathered once for the whole call: no collective per token, so ranks stop when they like.
            with torch.no_grad(), gathered(self.model), weights_cast_once(_device_of(self.model).type):
                return self._generate(self.model, prompts, num_generations, params)
        finally:
            self.model.train(was_training)

    def _generate(self, model, prompts: list[str], group: int, params: SamplingParams) -> RolloutBatch:
        """Decode with ``model`` (the policy, or its int8 copy: then its log-probs are recorded)."""
        device = _device_of(model)
        self.tokenizer.padding_side = "left"
        encoded = self.tokenizer(
            prompts, padding=True, return_tensors="pt", add_special_tokens=self.add_special_tokens
        ).to(device)
        stop = self._stop_matcher(params.stop)
        decoded = self._decode(model, encoded["input_ids"], encoded["attention_mask"], group, params, stop)
        return self._assemble(encoded, group, decoded, stop)

    def _stop_matcher(self, stop: list[str]) -> StopStringMatcher:
        """One matcher per stop list, kept: it remembers which token ids can end a stop string."""
        key = tuple(stop)
        if key not in self._stop_matchers:
            self._stop_matchers[key] = StopStringMatcher(self.tokenizer, stop)
        return self._stop_matchers[key]

    def _decode(self, model, input_ids, attention_mask, group: int, params: SamplingParams,
                stop: StopStringMatcher) -> _Decoded:
        """The sampling loop: one token per live row per step until every row has ended.

        One device-to-host copy per step, of the sampled tokens: the end-of-row decisions (EOS,
        stop strings) are made on the host from it. A stop string's tail is decoded only for rows
        whose newest token may end one (see StopStringMatcher).
        """
        device, rows, limit = input_ids.device, input_ids.shape[0] * group, params.max_new_tokens
        generator = _generator(params.seed, device)
        eos = set(self.eos_token_ids)
        result = _Decoded(
            completion_ids=torch.full((rows, limit), self.tokenizer.pad_token_id, dtype=torch.long, device=device),
            lengths=torch.full((rows,), limit, dtype=torch.long),
            ended=torch.zeros(rows, dtype=torch.bool),
            stopped_by_string=torch.zeros(rows, dtype=torch.bool),
            # a sampler other than the policy: its log-probs weight the loss (importance correction)
            sampling_logps=None if model is self.model else torch.zeros((rows, limit), device=device),
        )
        generated: list[list[int]] = [[] for _ in range(rows)]  # python copies, for stop strings only

        logits, cache, positions = self._prefill(model, input_ids, attention_mask, group, room=limit)
        attention_mask = attention_mask.repeat_interleave(group, dim=0)
        active = torch.arange(rows, device=device)  # original row index of each live batch row
        active_rows = list(range(rows))  # the same, on the host
        for step in range(limit):
            tokens = next_tokens(logits, params.temperature, params.top_k, params.top_p, generator)  # [B]
            result.completion_ids[active, step] = tokens
            if result.sampling_logps is not None:
                result.sampling_logps[active, step] = sampling_logps(logits, tokens, params.temperature)
            finished = []  # batch positions whose row ends with this token
            for position, (row, token) in enumerate(zip(active_rows, tokens.tolist())):
                if token in eos:
                    finished.append(position)
                elif stop:
                    generated[row].append(token)
                    if stop.may_end(token) and stop.ends_with_stop(generated[row]):
                        finished.append(position)
                        result.stopped_by_string[row] = True
            if finished:
                done = [active_rows[position] for position in finished]
                result.lengths[done] = step + 1
                result.ended[done] = True
            if step == limit - 1 or len(finished) == len(active_rows):
                break
            if self.stop_token is not None and self.stop_token.ends_rows():  # the step gives these rows up
                ended_here = set(finished)
                result.lengths[[row for position, row in enumerate(active_rows) if position not in ended_here]] = step + 1
                break
            if finished:
                # Finished rows leave the batch: the rest decode on a smaller, cheaper batch.
                ended_here = set(finished)
                kept = [position for position in range(len(active_rows)) if position not in ended_here]
                active_rows = [active_rows[position] for position in kept]
                keep = torch.tensor(kept, device=device)
                active, tokens, positions = active[keep], tokens[keep], positions[keep]
                attention_mask = attention_mask[keep]
                cache.batch_select_indices(keep)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones((len(active_rows), 1))], dim=-1)
            positions = positions + 1
            logits = self._decode_step(model, tokens, attention_mask, positions, cache)
        return result

    def _assemble(self, encoded, group: int, decoded: _Decoded, stop: StopStringMatcher) -> RolloutBatch:
        prompts = [
            ids[mask.bool()].tolist() for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"])
        ]
        completions = [ids[:length] for ids, length in zip(decoded.completion_ids.tolist(), decoded.lengths.tolist())]
        texts = self.tokenizer.batch_decode(completions, skip_special_tokens=True)
        texts = [stop.cut(text) if hit else text for text, hit in zip(texts, decoded.stopped_by_string.tolist())]
        logps = None if decoded.sampling_logps is None else \
            [row[:length] for row, length in zip(decoded.sampling_logps.tolist(), decoded.lengths.tolist())]
        return batch_from_token_lists(
            prompt_ids=[prompt for prompt in prompts for _ in range(group)],
            completion_ids=completions,
            ended=decoded.ended.tolist(),
            completion_texts=texts,
            pad_token_id=self.tokenizer.pad_token_id,
            device=decoded.completion_ids.device,
            sampling_logps=logps,
        )

    def _prefill(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, group: int, room: int):
        """Encode each distinct prompt once, then copy its logits and cache `group` times, with `room`
        for the tokens decoding will add."""
        positions = (attention_mask.cumsum(-1) - 1).clamp_min(0)  # left padding: count real tokens
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True)
        try:
            # Only the last position's logits are needed: skips a [U, P, V] projection.
            output = model(**inputs, logits_to_keep=1)
        except TypeError:  # custom (remote-code) models without the argument
            output = model(**inputs)
        cache = output_cache(output)  # the model builds the cache type its layers need
        if not (shares_prompt_cache(model) and share_prompt_cache(cache, group, room)):  # the prompt once per group
            if group > 1:
                cache.batch_repeat_interleave(group)
            preallocate(cache, room)
        logits = output.logits[:, -1, :].repeat_interleave(group, dim=0)  # [N, V]
        return logits, cache, positions[:, -1:].repeat_interleave(group, dim=0)

    def _decode_step(self, model, tokens, attention_mask, positions, cache) -> torch.Tensor:
        if runs_llama_decode_step(model, cache):  # the int8 copy of a llama-family model: fewer operator calls
            return llama_decode_step(model, tokens, attention_mask, positions, cache)
        return self._forward_step(model, tokens, attention_mask, positions, cache)

    def _forward_step(self, model, tokens, attention_mask, positions, cache) -> torch.Tensor:
        """One token per row through the model's own forward (any architecture, any cache)."""
        output = model(
            input_ids=tokens.unsqueeze(-1),
            attention_mask=attention_mask,
            position_ids=positions,
            use_cache=True,
            **{self._cache_keyword: cache},
            **({"shared_prompt_step": SharedPromptStep(cache)} if shares_prompt_cache(model) else {}),
        )
        return output.logits[:, -1, :]


def default_eos_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's eos plus the model's generation_config eos ids (every backend stops on these)."""
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.append(configured)
    elif configured:
        ids.extend(configured)
    return ids


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def _generator(seed: int | None, device: torch.device) -> torch.Generator | None:
    if seed is None:
        return None
    return torch.Generator(device=device).manual_seed(seed)
