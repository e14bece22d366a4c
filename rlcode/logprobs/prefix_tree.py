"""The prompts of a micro-batch as a radix tree: each shared run of tokens appears once.

A GRPO group's G rows share their whole prompt; every prompt of a chat model shares the template's
system block; the turn samples of one episode share its history, each turn's context extending the
previous one. The tree (a compressed trie of the rows' prompt token ids) holds each of those runs
once, as the segment of one node; a row's prompt is the concatenation of the segments on the path
from the top level to the node where it ends. The packed training pass lays the tree out as one
sequence (``rlcode.logprobs.packed_pass``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass
class TreeLevel:
    """The nodes at one depth: node i continues node ``parents[i]`` of the level above."""

    segments: list[list[int]] = field(default_factory=list)
    """Each node's own tokens (never empty)."""
    parents: list[int] = field(default_factory=list)
    """Index of each node's parent in the level above (-1 on the top level)."""
    offsets: list[int] = field(default_factory=list)
    """Tokens on the path before each node's segment: the position of its first token."""


@dataclass
class PrefixTree:
    levels: list[TreeLevel]
    row_ends: list[tuple[int, int]]
    """(level, node) where each row's prompt ends."""

    @property
    def tokens(self) -> int:
        """Prompt tokens the tree holds: what the packed pass runs of the prompts."""
        return sum(len(segment) for level in self.levels for segment in level.segments)


def prefix_tree(prompts: list[list[int]]) -> PrefixTree:
    """Rows' prompt token ids (unpadded, none empty) -> their radix tree."""
    if any(not prompt for prompt in prompts):
        raise ValueError("prefix_tree got an empty prompt: every row needs at least one prompt token.")
    levels: list[TreeLevel] = []
    row_ends: list[tuple[int, int] | None] = [None] * len(prompts)
    # Depth-first with an explicit stack: (rows sharing prompt[:start], start, depth, parent node).
    pending = [(list(range(len(prompts))), 0, 0, -1)]
    while pending:
        rows, start, depth, parent = pending.pop()
        if depth == len(levels):
            levels.append(TreeLevel())
        level = levels[depth]
        by_next_token: dict[int, list[int]] = defaultdict(list)
        for row in rows:
            by_next_token[prompts[row][start]].append(row)
        for group in by_next_token.values():
            end = start + _common_length(prompts, group, start)
            node = len(level.segments)
            level.segments.append(prompts[group[0]][start:end])
            level.parents.append(parent)
            level.offsets.append(start)
            longer = []
            for row in group:
                if len(prompts[row]) == end:
                    row_ends[row] = (depth, node)
                else:
                    longer.append(row)
            if longer:
                pending.append((longer, end, depth + 1, node))
    return PrefixTree(levels, row_ends)  # type: ignore[arg-type]


def _common_length(prompts: list[list[int]], rows: list[int], start: int) -> int:
    """Length of the run the rows share from ``start`` (at least 1: they share the token there)."""
    first = prompts[rows[0]]
    limit = min(len(prompts[row]) for row in rows)
    end = start + 1
    while end < limit and all(prompts[row][end] == first[end] for row in rows):
        end += 1
    return end - start
