"""Decode attention that reads each prompt's keys and values once for its whole group.

A GRPO rollout decodes G completions of the same prompt side by side. transformers' cache holds a copy
of the prompt's keys and values per row, and every decode step's attention streams all of them: with
G = 4 and a 200-token prompt that is four reads of the same bytes per layer per token, and G times the
rows in each small matmul over them, a third of the int8 copy's decode step. Here the prompt's
keys and values are kept once per prompt (the *prefix*); each row keeps only the tokens it generated
(the *suffix*, written in place into a buffer with room for the whole completion, as ``kv_cache``
does). A step's attention then scores the group's queries against their prompt in one matmul per
prompt and key/value head (the prompt's keys are read once for G x heads-per-key-head query rows),
scores each row's suffix, takes one softmax over both (the same normalisation as over the
concatenation) and sums the two weighted values: a group's prompt is read once per step instead of G
times (``benchmarks/rollout_speed.py --decode-step --group`` times the step both ways; its dated runs
are in ``benchmarks/journal/speed.md``).

The result equals SDPA's over the full cache up to float rounding (the sums run in another order:
tested within a bound derived from the fp32 epsilon), not bit for bit, so it is used only by a sampler
whose log-probs are recorded and corrected for anyway: the int8 copy (``quantized_sampler``). Rows that
finish leave the batch (``batch_select_indices``); a prompt whose rows have all finished leaves the
prefix, so its keys are no longer read.

How it plugs into transformers: the copy's attention implementation is ``SHARED_PROMPT_ATTENTION``, a
registered function that runs SDPA for anything that is not a decode step over a ``SharedPromptLayer``
(the prefill, a layer of another cache type). The backend passes it a ``SharedPromptStep`` (the cache,
and the step's mask in the grouped layout, built by the first layer and reused by the others) as the
``shared_prompt_step`` keyword, which transformers forwards from the model call to every attention call.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from rlcode.rollout.attention_kernel import fused_attention_kernel
from rlcode.rollout.kv_cache import PreallocatedLayer

SHARED_PROMPT_ATTENTION = "rlcode_shared_prompt"


class SharedPromptLayer(PreallocatedLayer):
    """One layer's cache: the prompts' keys/values once each (``prefix_keys``/``prefix_values``), and
    every row's generated tokens written in place (``PreallocatedLayer``'s buffers, which transformers
    sees as ``keys``/``values``).

    ``slots`` maps each live row to ``prompt * group + member`` (its prompt's index in the prefix and
    its place in the group), the layout the grouped attention scatters queries into.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, group: int, room: int) -> None:
        prompts, heads, _, head_dim = keys.shape  # [U, kv heads, P, D]
        super().__init__(keys.new_empty(prompts * group, heads, 0, head_dim),
                         values.new_empty(prompts * group, heads, 0, values.shape[-1]), room)
        self.prefix_keys, self.prefix_values, self.group = keys.contiguous(), values.contiguous(), group
        self.slots = torch.arange(prompts * group, device=keys.device)
        self._transposed_keys = None  # the fused kernel's layout, made on its first use
        self._row_prompts, self._prompts_of = None, None  # row_prompts() for the slots they were read from

    def prefix_keys_transposed(self) -> torch.Tensor:
        """[U, Hkv, D, P padded to a multiple of 16]: the prompts' keys as the fused kernel reads them."""
        if self._transposed_keys is None:
            padding = -self.prefix_keys.shape[-2] % 16
            self._transposed_keys = F.pad(self.prefix_keys.transpose(-1, -2), (0, padding)).contiguous()
        return self._transposed_keys

    def row_prompts(self) -> torch.Tensor | None:
        """Each live row's prompt index, or None when the rows are not in prompt order (the fused kernel
        walks each prompt's rows); read once per change of ``slots``, not once per layer and step."""
        if self._prompts_of is not self.slots:
            prompts = self.slots // self.group
            ordered = len(prompts) < 2 or not bool((prompts[1:] < prompts[:-1]).any())
            self._row_prompts, self._prompts_of = (prompts if ordered else None), self.slots
        return self._row_prompts

    def get_seq_length(self) -> int:
        return self.prefix_keys.shape[-2] + self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.get_seq_length() + query_length, 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows at ``indices``; drop the prompts none of them belongs to."""
        super().batch_select_indices(indices)
        slots = self.slots[indices]
        prompts, members = slots // self.group, slots % self.group
        live, renumbered = torch.unique(prompts, return_inverse=True)  # sorted: prompts keep their order
        if len(live) < self.prefix_keys.shape[0]:
            self.prefix_keys, self.prefix_values = self.prefix_keys[live], self.prefix_values[live]
            if self._transposed_keys is not None:
                self._transposed_keys = self._transposed_keys[live]
        self.slots = renumbered * self.group + members

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("a shared-prompt cache is built already grouped (share_prompt_cache)")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a shared-prompt cache does not crop")


def share_prompt_cache(cache, group: int, room: int) -> bool:
    """Turn the prefill's cache (one row per prompt) into shared-prompt layers for ``group`` rows per
    prompt with ``room`` generated tokens each; other layer types get their rows repeated instead.
    False (nothing changed) for a cache class without per-layer objects."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return False
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer and layer.get_seq_length() > 0:
            layers[index] = SharedPromptLayer(layer.keys, layer.values, group, room)
        elif group > 1:
            layer.batch_repeat_interleave(group)
    return True


def shares_prompt_cache(model) -> bool:
    """Whether ``model`` decodes with this module's attention (set by ``use_shared_prompt_attention``)."""
    return getattr(getattr(model, "config", None), "_attn_implementation", None) == SHARED_PROMPT_ATTENTION


# Architectures whose attention is plain scaled dot-product over the cache (what the grouped attention
# computes). Others may add terms it would drop (soft-capping, attention sinks, position biases), so
# they keep SDPA and the per-row cache.
PLAIN_ATTENTION_MODELS = ("llama", "mistral", "qwen2", "qwen3")


def use_shared_prompt_attention(model) -> bool:
    """Switch a plain-attention model that uses SDPA to the shared-prompt attention (SDPA outside decode
    steps); any other model is left as it is (False)."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or config.model_type not in PLAIN_ATTENTION_MODELS:
        return False  # eager, flash or a custom kernel is the user's choice; other architectures keep SDPA
    config._attn_implementation = SHARED_PROMPT_ATTENTION
    return True


class SharedPromptStep:
    """What one decode step's attention calls share: the cache, and its mask in the grouped layout
    (every layer gets the same mask and the same rows, so the first layer builds it for all)."""

    def __init__(self, cache) -> None:
        self.cache = cache
        self._mask, self._grouped_mask = None, None

    def layer(self, index: int):
        layers = getattr(self.cache, "layers", None)
        return None if layers is None else layers[index]

    def grouped_mask(self, mask: torch.Tensor | None, layer: SharedPromptLayer, per_kv: int) -> torch.Tensor | None:
        if mask is not self._mask:  # the model's mask for this step (held here, so its identity is unique)
            self._mask = mask
            self._grouped_mask = group_mask(mask, layer.slots, layer.prefix_keys.shape[0], layer.group, per_kv)
        return self._grouped_mask


def group_mask(mask: torch.Tensor | None, slots: torch.Tensor, prompts: int, group: int,
               per_kv: int) -> torch.Tensor | None:
    """[B, 1, 1, P + S] (bool, True: attend; or additive float) -> [U, 1, G*R, P + S], the layout of
    ``grouped_decode_attention``'s scores; a finished row's slot attends everywhere (its scores are
    never read). None stays None."""
    if mask is None:
        return None
    rows, width = mask.shape[0], mask.shape[-1]
    per_row = mask.reshape(rows, 1, 1, width).expand(rows, 1, per_kv, width)  # [B, 1, R, P + S]
    return _to_groups(per_row, slots, prompts, group, fill=True if mask.dtype == torch.bool else 0.0)


def grouped_decode_attention(
    query: torch.Tensor,  # [B, Hq, 1, D]: one new token per live row
    prefix_keys: torch.Tensor,  # [U, Hkv, P, D]: each live prompt once
    prefix_values: torch.Tensor,  # [U, Hkv, P, D]
    suffix_keys: torch.Tensor,  # [B, Hkv, S, D]: each row's generated tokens, the new one included
    suffix_values: torch.Tensor,  # [B, Hkv, S, D]
    slots: torch.Tensor,  # [B]: prompt * group + member of each row
    group: int,
    grouped_mask: torch.Tensor | None,  # [U, 1, G*R, P + S] from ``group_mask``; None: attend to all
    scale: float,
) -> torch.Tensor:  # [B, 1, Hq, D]
    rows, query_heads, _, head_dim = query.shape
    prompts, kv_heads, prefix, _ = prefix_keys.shape
    per_kv = query_heads // kv_heads  # query heads reading each key/value head (GQA)
    q = query.reshape(rows, kv_heads, per_kv, head_dim) * scale  # [B, Hkv, R, D]

    # The softmax runs in the grouped layout [U, Hkv, G*R, .]: a prompt's G x R query rows side by side,
    # so the prompt's keys and values enter one matmul each. Only the small per-row tensors (queries,
    # suffix scores and weights, outputs) move between the layouts.
    to_groups = functools.partial(_to_groups, slots=slots, prompts=prompts, group=group)
    to_rows = functools.partial(_to_rows, slots=slots, prompts=prompts, group=group)
    prefix_scores = torch.matmul(to_groups(q), prefix_keys.transpose(-1, -2))  # [U, Hkv, G*R, P]
    suffix_scores = torch.matmul(q, suffix_keys.transpose(-1, -2))  # [B, Hkv, R, S]
    scores = torch.cat([prefix_scores, to_groups(suffix_scores)], dim=-1)  # [U, Hkv, G*R, P + S]
    if grouped_mask is not None and grouped_mask.dtype == torch.bool:
        scores = scores.masked_fill(~grouped_mask, float("-inf"))
    elif grouped_mask is not None:
        scores = scores + grouped_mask
    weights = scores.softmax(dim=-1)

    from_prefix = to_rows(torch.matmul(weights[..., :prefix], prefix_values))  # [B, Hkv, R, D]
    from_suffix = torch.matmul(to_rows(weights[..., prefix:]), suffix_values)  # [B, Hkv, R, D]
    return (from_prefix + from_suffix).reshape(rows, query_heads, 1, head_dim).transpose(1, 2)


def fused_decode_attention(query: torch.Tensor, layer: SharedPromptLayer, suffix_keys: torch.Tensor,
                           suffix_values: torch.Tensor, row_mask: torch.Tensor | None,
                           scale: float) -> torch.Tensor | None:
    """``grouped_decode_attention`` by the fused CPU kernel (``attention_kernel``): query [B, Hq, 1, D],
    the layer's prompts, suffix_keys/values [B, Hkv, S, D], row_mask [B, >= P] bool (True: attend; its
    first P columns are the prompt's) or None -> [B, 1, Hq, D]. None where the kernel does not apply (not
    built, not fp32 on CPU, rows out of prompt order), and the caller runs the torch attention."""
    kernel = fused_attention_kernel()
    if kernel is None or query.dtype != torch.float32 or query.device.type != "cpu":
        return None
    prompts = layer.row_prompts()
    if prompts is None:
        return None
    rows, query_heads, _, head_dim = query.shape
    kv_heads = suffix_keys.shape[1]
    grouped_query = query.reshape(rows, kv_heads, query_heads // kv_heads, head_dim).contiguous()
    mask = torch.empty(0, dtype=torch.bool) if row_mask is None else row_mask
    output = kernel.shared_prompt_attention(grouped_query, layer.prefix_keys_transposed(), layer.prefix_values,
                                            suffix_keys, suffix_values, prompts, mask, scale)
    return output.reshape(rows, query_heads, 1, head_dim).transpose(1, 2)


def _to_groups(per_row: torch.Tensor, slots, prompts: int, group: int, fill=0.0) -> torch.Tensor:
    """[B, H, R, X] (rows) -> [U, H, G*R, X] (each prompt's rows side by side; a finished row's slot
    holds ``fill``). H may be 1 (a mask shared by the heads)."""
    rows, heads, per_kv, width = per_row.shape
    if rows != prompts * group:  # rows have finished: scatter the live ones into their slots
        per_row = per_row.new_full((prompts * group, heads, per_kv, width), fill).index_copy_(0, slots, per_row)
    grouped = per_row.view(prompts, group, heads, per_kv, width).transpose(1, 2)
    return grouped.reshape(prompts, heads, group * per_kv, width)


def _to_rows(grouped: torch.Tensor, slots, prompts: int, group: int) -> torch.Tensor:
    """[U, H, G*R, X] -> [B, H, R, X]: the inverse of ``_to_groups`` for the live rows."""
    _, heads, _, width = grouped.shape
    per_row = grouped.reshape(prompts, heads, group, -1, width).transpose(1, 2)
    per_row = per_row.reshape(prompts * group, heads, -1, width)
    return per_row if len(slots) == prompts * group else per_row.index_select(0, slots)


def shared_prompt_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: float | None = None, shared_prompt_step: SharedPromptStep | None = None,
                            **kwargs):
    """transformers' attention-function signature: the grouped decode attention for a decode step over
    a ``SharedPromptLayer`` (``shared_prompt_step``: the step's cache and grouped mask), SDPA for
    everything else."""
    layer = None if shared_prompt_step is None else shared_prompt_step.layer(module.layer_idx)
    if not isinstance(layer, SharedPromptLayer) or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if attention_mask is None or attention_mask.dtype == torch.bool:  # [B, 1, 1, P + S]: a row's mask
        row_mask = None if attention_mask is None else attention_mask[:, 0, 0, :]
        output = fused_decode_attention(query, layer, key, value, row_mask, scale)
        if output is not None:
            return output, None
    per_kv = query.shape[1] // key.shape[1]
    output = grouped_decode_attention(query, layer.prefix_keys, layer.prefix_values, key, value, layer.slots,
                                      layer.group, shared_prompt_step.grouped_mask(attention_mask, layer, per_kv),
                                      scale)
    return output, None


AttentionInterface.register(SHARED_PROMPT_ATTENTION, shared_prompt_attention)
AttentionMaskInterface.register(SHARED_PROMPT_ATTENTION, sdpa_mask)  # the same masks SDPA gets
