"""The training pass as one decoder call per micro-batch: every prompt once, its completions packed after it.

The plain pass runs prompt + completion for every row, padded to the longest: a GRPO group of G rows
runs its prompt G times in forward and backward, and each turn sample of an episode re-runs the whole
history before it. Here a micro-batch becomes one sequence (batch size 1, no padding): the prompts'
radix tree (``prefix_tree``) in depth-first order, each shared run of tokens once, and each row's
completion right after the node where its prompt ends. A 4-D mask lets a token see the tokens of its
own segment before it and every token of its ancestors' segments: a completion sees its prompt and
itself, not its siblings; a turn sample sees the history it extends. Position ids count each token's
place on its own path, so every token is computed as in the plain pass; only the order of
floating-point additions differs (the shared tokens' gradients are summed by the attention's backward
instead of by the weights').

Why one call: a GPU runs the decoder's fused kernels once over all tokens of a micro-batch, with no
per-level cache gathers or host round trips (the radix tree is built on the host from one copy of
the prompt ids), and under FSDP every rank makes the same number of decoder calls per micro-batch.

Inputs: a completion's last token predicts nothing, so it is not fed; output t of a row (predicting
completion token t) is read at the row's last prompt token for t = 0 and at completion token t - 1
after that. Only the outputs that predict real completion tokens are returned (``PackedLayout.predicting``).

The mask: the dense [1, 1, N, N] form for SDPA (boolean) and eager attention (additive), which
computes all N^2 scores, masked ones included; FlexAttention (a model loaded with
``attn_implementation="flex_attention"``) gets a ``BlockMask`` of the same rule and skips the masked
blocks, which is what keeps long packed micro-batches cheap on a GPU. Attention kernels that take no
arbitrary mask (flash-attention 2/3) and sliding windows shorter than a row run the plain pass
(``packed_pass_support`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from rlcode.logprobs.prefix_tree import prefix_tree

MASKED_ATTENTION = ("sdpa", "eager", "flex_attention")  # attention implementations that take a 4-D mask


@dataclass(frozen=True)
class PackedLayout:
    """One micro-batch as one sequence of N tokens in S segments (tree nodes and completions)."""

    input_ids: Tensor  # [1, N]
    position_ids: Tensor  # [1, N] each token's place on its own path
    segment_ids: Tensor  # [N] the segment each token belongs to
    ancestors: Tensor  # [S, S] bool: ancestors[s, a] when segment a is s or one of its ancestors
    predicting: Tensor  # [A] the position whose output predicts each real completion token, row-major

    @property
    def length(self) -> int:
        return self.input_ids.size(1)


def packed_pass_support(model: nn.Module, longest_row: int) -> str | None:
    """None if ``model`` can run the packed pass over rows of up to ``longest_row`` tokens, else why not."""
    config = _text_config(model)
    if config is None:
        return f"{type(model).__name__} has no transformers config"
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in MASKED_ATTENTION:
        return (f"its attention implementation {implementation!r} takes no prefix-sharing mask "
                f"(one of {', '.join(MASKED_ATTENTION)} does)")
    window = getattr(config, "sliding_window", None)
    if window is not None and longest_row > window:
        return f"a row of {longest_row} tokens is longer than its sliding window of {window}"
    return None


def _text_config(model: nn.Module):
    """The model's (text) transformers config, whose attention settings the decoder reads; None without one."""
    config = getattr(model, "config", None)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def packed_layout(prompts: list[list[int]], completions: list[list[int]], device: torch.device) -> PackedLayout:
    """Rows' prompt token ids (none empty) and completion token ids (real tokens only) -> their packing."""
    tree = prefix_tree(prompts)
    ending: dict[tuple[int, int], list[int]] = {}
    for row, end in enumerate(tree.row_ends):
        ending.setdefault(end, []).append(row)
    children: dict[tuple[int, int], list[int]] = {}
    for depth, level in enumerate(tree.levels[1:], start=1):
        for node, parent in enumerate(level.parents):
            children.setdefault((depth - 1, parent), []).append(node)

    tokens: list[int] = []
    positions: list[int] = []
    segments: list[int] = []
    parents: list[int] = []  # per segment: its parent segment, -1 at the top
    predicting: list[list[int]] = [[] for _ in prompts]

    def add_segment(ids: list[int], first_position: int, parent: int) -> int:
        parents.append(parent)
        segment = len(parents) - 1
        tokens.extend(ids)
        positions.extend(range(first_position, first_position + len(ids)))
        segments.extend([segment] * len(ids))
        return segment

    stack = [(0, node, -1) for node in reversed(range(len(tree.levels[0].segments)))]
    while stack:  # depth-first: a subtree (a group and its completions) is one contiguous stretch
        depth, node, parent = stack.pop()
        level = tree.levels[depth]
        segment = add_segment(level.segments[node], level.offsets[node], parent)
        last_prompt_token = len(tokens) - 1
        prompt_length = level.offsets[node] + len(level.segments[node])
        for row in ending.get((depth, node), []):
            fed = completions[row][:-1]  # the last token predicts nothing we sampled
            start = len(tokens)
            if fed:
                add_segment(fed, prompt_length, segment)
            predicting[row] = ([last_prompt_token] if completions[row] else []) + list(range(start, start + len(fed)))
        stack.extend((depth + 1, child, segment) for child in reversed(children.get((depth, node), [])))

    ancestors = torch.eye(len(parents), dtype=torch.bool)
    for segment, parent in enumerate(parents):  # parents come before their children
        if parent >= 0:
            ancestors[segment] |= ancestors[parent]
    flat = [position for row in predicting for position in row]
    return PackedLayout(
        input_ids=torch.tensor([tokens], device=device),
        position_ids=torch.tensor([positions], device=device),
        segment_ids=torch.tensor(segments, device=device),
        ancestors=ancestors.to(device),
        predicting=torch.tensor(flat, dtype=torch.long, device=device))


def attention_mask(layout: PackedLayout, model: nn.Module, dtype: torch.dtype):
    """The prefix-sharing causal mask in the form ``model``'s attention takes: [1, 1, N, N] boolean
    (SDPA: True attends), additive in ``dtype`` (eager), or a FlexAttention ``BlockMask``."""
    segment_ids, ancestors = layout.segment_ids, layout.ancestors
    implementation = _text_config(model)._attn_implementation
    if implementation == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        def sees(batch, head, query, key):  # noqa: ARG001 - FlexAttention's mask_mod signature
            return (key <= query) & ancestors[segment_ids[query], segment_ids[key]]

        return create_block_mask(sees, B=None, H=None, Q_LEN=layout.length, KV_LEN=layout.length,
                                 device=segment_ids.device)
    sees = ancestors[segment_ids.unsqueeze(1), segment_ids.unsqueeze(0)].tril_()  # [N, N] query x key
    if implementation == "eager":
        return torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill_(
            ~sees, torch.finfo(dtype).min)[None, None]
    return sees[None, None]


def row_tokens(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
               completion_mask: Tensor) -> tuple[list[list[int]], list[list[int]]] | None:
    """[B, P] prompts and [B, C] completions -> each row's real prompt and completion token ids (one host
    copy), or None unless the prompts are left-padded and the completions right-padded (what the
    plain pass's positions assume too; anything else runs the plain pass)."""
    width = prompt_ids.size(1)
    host = torch.cat([prompt_ids, completion_ids, prompt_mask.long(), completion_mask.long()], dim=1).tolist()
    prompts, completions = [], []
    for row in host:
        ids, mask = row[: len(row) // 2], row[len(row) // 2:]
        prompt_length, completion_length = sum(mask[:width]), sum(mask[width:])
        real = sum(mask[width - prompt_length:width + completion_length])
        if prompt_length == 0 or real != prompt_length + completion_length:  # a hole, or padding elsewhere
            return None
        prompts.append(ids[width - prompt_length:width])
        completions.append(ids[width:width + completion_length])
    return prompts, completions


def packed_outputs(model: nn.Module, layout: PackedLayout, *, hidden_states: bool) -> Tensor:
    """One model call over the packed micro-batch -> [A, X] outputs predicting its A real completion
    tokens (row-major: the order of ``completion_mask.bool()``).

    ``model`` is a decoder body (``hidden_states=True``: X = hidden size) or a causal LM (X = vocabulary).
    """
    inputs = dict(input_ids=layout.input_ids, position_ids=layout.position_ids, use_cache=False,
                  attention_mask=attention_mask(layout, model, model.get_input_embeddings().weight.dtype))
    if hidden_states:
        return model(**inputs).last_hidden_state[0].index_select(0, layout.predicting)  # [A, H]
    return model(**inputs, logits_to_keep=layout.predicting).logits[0]  # [A, V]: the head runs on those only
