"""Detecting stop strings in completions as they grow, one token at a time."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Tells whether the newest token of a completion finished one of the stop strings.

    Only a tail of the completion is decoded each step: a stop string that ends in the newest token
    lies within the last `window` tokens, because every token decodes to at least one character or
    at least one byte of one (4 tokens per character at worst for byte-level vocabularies).
    """

    def __init__(self, tokenizer, stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.window = 4 * max((len(text) for text in self.stop), default=0) + 2

    def __bool__(self) -> bool:
        return bool(self.stop)

    def ends_with_stop(self, completion_ids: Sequence[int]) -> bool:
        """True when a stop string occurs in the decoded tail of `completion_ids`."""
        tail = self.tokenizer.decode(completion_ids[-self.window :], skip_special_tokens=False)
        return any(text in tail for text in self.stop)

    def cut(self, text: str) -> str:
        """`text` up to and including the earliest-ending stop string (unchanged without one)."""
        ends = [text.find(stop) + len(stop) for stop in self.stop if stop in text]
        return text[: min(ends)] if ends else text
