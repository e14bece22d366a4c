"""A training forward pass that runs each shared prompt prefix once, with gradients.

The plain pass runs prompt + completion for every row, so a GRPO group of G rows runs its prompt G
times in forward and backward (with ~200-token MBPP prompts and <= 64-token completions, G = 4 is
1,056 tokens per group where 456 would do), and each turn sample of an episode re-runs the whole
history before it. Here the micro-batch's prompts become a radix tree (``prefix_tree``) and run
one tree level per forward call: a node's segment runs on top of its parent's key/value cache,
gathered to the node's batch position; then every row runs only its completion tokens on top of
the cache of the node where its prompt ends.

Why the gradients are exact: the gather (``index_select``) is differentiable and its backward sums
the gradients of every row that read a cached key or value; the unshared pass computes the same
prefix once per row and sums the same gradients through the shared weights. Only the order of
floating-point additions differs.

Padding: a level's segments are left-padded to its widest, and a row's cache is padded at its end
to the longest row's; the masks zero every pad, and position ids count real tokens, so each token
attends to exactly the tokens of its own row before it, at the positions it was sampled at.

Gradient checkpointing: transformers drops the cache of a checkpointed layer in training, because
the backward pass replays the layer and a growing cache would be appended to twice. Here each
layer's cache is replay-safe instead (``_replay_safe_layer``: its update returns and stores "parent
keys + this call's keys", so a replay recomputes the same tensors), and the checkpointed layers are
told to keep it for the pass (transformers' ``_can_checkpoint_with_cache``). This needs torch's
non-reentrant checkpointing (rlcode's; the reentrant kind gives no gradient to the key/values the
next level reads) and a transformers version with that switch.

Models that cannot take it run the plain pass (``shared_prefix_support`` says why, logged once):
caches that are not plain growing key/value tensors (sliding-window, linear-attention, quantized
layers), reentrant gradient checkpointing or a transformers without ``_can_checkpoint_with_cache``,
and transformers versions without per-layer caches.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from rlcode.logprobs.prefix_tree import PrefixTree
from rlcode.models.cache_name import cache_argument


def shared_prefix_support(model: nn.Module) -> str | None:
    """None if ``model`` can run the shared-prefix pass, else the reason it cannot (one line)."""
    if model.training:
        reason = _checkpointing_reason(model)
        if reason is not None:
            return reason
    try:
        from transformers.cache_utils import DynamicCache, DynamicLayer
    except ImportError:
        return "this transformers version has no per-layer DynamicCache"
    config = getattr(model, "config", None)
    if config is None:
        return f"{type(model).__name__} has no transformers config"
    try:
        cache = DynamicCache(config=config)
    except Exception as error:  # noqa: BLE001 - any failure means: not a cache we understand
        return f"no DynamicCache for this config ({type(error).__name__}: {error})"
    kinds = {type(layer).__name__ for layer in getattr(cache, "layers", [])}
    if not kinds:
        return "this transformers version has no per-layer DynamicCache"
    if kinds != {DynamicLayer.__name__}:
        return f"its cache layers are {', '.join(sorted(kinds))} (only plain DynamicLayer key/values can be shared)"
    return None


def shared_prefix_outputs(model: nn.Module, tree: PrefixTree, prompt_lengths: Tensor, completion_ids: Tensor,
                          completion_mask: Tensor, *, hidden_states: bool) -> Tensor:
    """The rows' prompt tree + [B, C] right-padded completions -> [B, C, X] outputs predicting them.

    Output t of a row predicts its completion token t: the last prompt position's output, then
    completion positions 0..C-2. ``model`` is a decoder body (``hidden_states=True``: X = hidden
    size, read from ``last_hidden_state``) or a causal LM (X = vocabulary, its logits).
    ``prompt_lengths``: [B] real prompt tokens per row.
    """
    device = completion_ids.device
    run = _Runner(model, hidden_states)
    caches: list[list[tuple[Tensor, Tensor]]] = []  # per level: per layer (keys, values) [n, h, L, d]
    masks: list[Tensor] = []  # per level: [n, L] 1 on real tokens
    last_outputs: list[Tensor] = []  # per level: [n, X] output of each node's last token
    for depth, level in enumerate(tree.levels):
        ids, segment_mask = _left_padded(level.segments, device)  # [n, W]
        offsets = torch.tensor(level.offsets, device=device).unsqueeze(1)  # [n, 1]
        positions = offsets + (segment_mask.cumsum(-1) - 1).clamp(min=0)  # [n, W]
        if depth == 0:
            past, mask = None, segment_mask
        else:
            parents = torch.tensor(level.parents, device=device)
            past = _gathered(caches[-1], parents, 0)
            mask = torch.cat([masks[-1].index_select(0, parents), segment_mask], dim=1)  # [n, L + W]
        outputs, cache = run(ids, mask, positions, past, last_only=True)
        caches.append(cache)
        masks.append(mask)
        last_outputs.append(outputs[:, -1])  # left padding: the last column is always a real token

    past, mask, first = _row_prefixes(tree, caches, masks, last_outputs, device)
    positions = prompt_lengths.to(device).unsqueeze(1) + torch.arange(completion_ids.size(1), device=device)  # [B, C]
    mask = torch.cat([mask, completion_mask.to(mask.dtype)], dim=1)  # [B, L + C]
    outputs, _ = run(completion_ids, mask, positions, past, last_only=False)  # [B, C, X]
    return torch.cat([first.unsqueeze(1), outputs[:, :-1]], dim=1)  # [B, C, X]


def prompt_lists(prompt_ids: Tensor, prompt_mask: Tensor) -> list[list[int]]:
    """[B, P] left-padded prompts -> B lists of their real token ids (one host copy)."""
    return [ids[:length] for ids, length in zip(_right_aligned(prompt_ids, prompt_mask).tolist(),
                                                prompt_mask.sum(-1).tolist())]


def _checkpointed_layers(model: nn.Module) -> list[nn.Module]:
    """The layers transformers checkpoints (``GradientCheckpointingLayer`` with checkpointing on)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return []
    return [module for module in model.modules()
            if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing]


def _checkpointing_reason(model: nn.Module) -> str | None:
    """None if ``model`` is not checkpointed or its checkpointing can keep a replay-safe cache."""
    layers = _checkpointed_layers(model)
    if not layers:
        return None
    if not hasattr(type(layers[0]), "_can_checkpoint_with_cache"):
        return "gradient checkpointing drops the key/value cache in this transformers version"
    function = getattr(layers[0], "_gradient_checkpointing_func", None)
    if getattr(function, "keywords", {}).get("use_reentrant", True) is not False:
        return ("reentrant gradient checkpointing gives no gradient to shared keys/values "
                "(enable it with gradient_checkpointing_kwargs={'use_reentrant': False})")
    return None


@functools.cache
def _replay_safe_layer():
    """``_ReplaySafeLayer``: a ``DynamicLayer`` holding its parent's keys/values, whose ``update``
    returns parent + new and keeps that. Unlike ``DynamicLayer`` (which appends), calling ``update``
    again with the same states gives the same result: what a gradient-checkpointing replay needs.
    (A class made on first use: transformers is imported only when the pass runs.)"""
    from transformers.cache_utils import DynamicLayer

    class _ReplaySafeLayer(DynamicLayer):
        def __init__(self, keys: Tensor | None, values: Tensor | None) -> None:
            super().__init__()
            self.past_keys, self.past_values = keys, values
            if keys is not None:
                self.keys, self.values, self.is_initialized = keys, values, True
                self.dtype, self.device = keys.dtype, keys.device

        def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
            if self.past_keys is None:
                self.keys, self.values = key_states, value_states
            else:
                self.keys = torch.cat([self.past_keys, key_states], dim=-2)
                self.values = torch.cat([self.past_values, value_states], dim=-2)
            self.is_initialized = True
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return 0 if self.past_keys is None else self.past_keys.shape[-2]

    return _ReplaySafeLayer


class _Runner:
    """One forward call on top of a cache; returns (outputs, per-layer key/values)."""

    def __init__(self, model: nn.Module, hidden_states: bool) -> None:
        self.model, self.hidden_states = model, hidden_states
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.num_layers = config.num_hidden_layers
        self.checkpointed = _checkpointed_layers(model)
        self.cache_keyword = cache_argument(model)

    def __call__(self, ids, mask, positions, past, *, last_only: bool):
        from transformers.cache_utils import DynamicCache

        cache = DynamicCache()
        past = past or [(None, None)] * self.num_layers
        cache.layers = [_replay_safe_layer()(keys, values) for keys, values in past]
        extra = {} if self.hidden_states or not last_only else {"logits_to_keep": 1}
        extra[self.cache_keyword] = cache
        for layer in self.checkpointed:  # keep the (replay-safe) cache under checkpointing, for this call
            layer._can_checkpoint_with_cache = True
        try:
            output = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra)
        finally:
            for layer in self.checkpointed:
                del layer._can_checkpoint_with_cache  # back to the class's False
        outputs = output.last_hidden_state if self.hidden_states else output.logits
        if last_only:
            outputs = outputs[:, -1:]
        # The cache passed in, filled in place: under gradient checkpointing the output carries none.
        return outputs, [(layer.keys, layer.values) for layer in cache.layers]


def _row_prefixes(tree: PrefixTree, caches, masks, last_outputs, device):
    """Each row's prefix: its end node's cache and mask padded to the longest row's, and last output."""
    width = max(masks[depth].size(1) for depth, _ in tree.row_ends)
    order, parts_cache, parts_mask, parts_first = [], [], [], []
    for depth in sorted({depth for depth, _ in tree.row_ends}):
        rows = [row for row, (row_depth, _) in enumerate(tree.row_ends) if row_depth == depth]
        nodes = torch.tensor([tree.row_ends[row][1] for row in rows], device=device)
        pad = width - masks[depth].size(1)
        parts_cache.append(_gathered(caches[depth], nodes, pad))
        parts_mask.append(torch.nn.functional.pad(masks[depth].index_select(0, nodes), (0, pad)))
        parts_first.append(last_outputs[depth].index_select(0, nodes))
        order.extend(rows)
    back = torch.empty(len(order), dtype=torch.long, device=device)
    back[torch.tensor(order, device=device)] = torch.arange(len(order), device=device)  # row -> its part row
    layers = [(torch.cat([part[layer][0] for part in parts_cache]).index_select(0, back),
               torch.cat([part[layer][1] for part in parts_cache]).index_select(0, back))
              for layer in range(len(parts_cache[0]))]
    return layers, torch.cat(parts_mask).index_select(0, back), torch.cat(parts_first).index_select(0, back)


def _gathered(cache: list[tuple[Tensor, Tensor]], index: Tensor, pad: int) -> list[tuple[Tensor, Tensor]]:
    """Per-layer key/values [n, h, L, d] -> rows ``index`` [m, h, L + pad, d] (zeros after L)."""
    def take(tensor: Tensor) -> Tensor:
        picked = tensor.index_select(0, index)
        return torch.nn.functional.pad(picked, (0, 0, 0, pad)) if pad else picked

    return [(take(keys), take(values)) for keys, values in cache]


def _left_padded(segments: list[list[int]], device) -> tuple[Tensor, Tensor]:
    """Token lists -> [n, W] ids (0 on padding) and mask, aligned to the right."""
    width = max(len(segment) for segment in segments)
    ids = torch.zeros(len(segments), width, dtype=torch.long)
    mask = torch.zeros(len(segments), width, dtype=torch.long)
    for row, segment in enumerate(segments):
        ids[row, width - len(segment):] = torch.tensor(segment)
        mask[row, width - len(segment):] = 1
    return ids.to(device), mask.to(device)


def _right_aligned(prompt_ids: Tensor, prompt_mask: Tensor) -> Tensor:
    """Left-padded rows -> the same rows with their real tokens first (for slicing on the host)."""
    order = torch.argsort((prompt_mask == 0).to(torch.int8), dim=1, stable=True)  # real tokens first
    return prompt_ids.gather(1, order)
