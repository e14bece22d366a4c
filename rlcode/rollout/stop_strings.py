"""Detecting stop strings in completions as they grow, one token at a time."""

from __future__ import annotations

from collections.abc import Sequence

_UNDECODABLE = "\ufffd"  # what a partial UTF-8 byte sequence decodes to


class StopStringMatcher:
    """Tells whether the newest token of a completion finished one of the stop strings.

    Only a tail of the completion is decoded: a stop string that ends in the newest token lies
    within the last `window` tokens, because every token decodes to at least one character or at
    least one byte of one (4 tokens per character at worst for byte-level vocabularies).

    And the tail is decoded only when the newest token `may_end` a stop string. A stop string
    absent from the text before this token and present after it must end in the text this token
    added, so that text holds the stop string's last character. The exceptions are caught as
    well: a token whose text is empty or holds an undecodable byte (it may complete a character
    begun by earlier tokens) always counts as a candidate. Each token id's text is decoded once,
    after a fixed anchor token, so it includes the leading space SentencePiece would strip at the
    start of a text.
    """

    def __init__(self, tokenizer, stop: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stop = list(stop)
        self.window = 4 * max((len(text) for text in self.stop), default=0) + 2
        self._last_characters = {text[-1] for text in self.stop}
        self._may_end: dict[int, bool] = {}  # token id -> candidate, filled as ids are sampled
        self._anchor = tokenizer.encode("a", add_special_tokens=False)[-1:] if self.stop else []
        self._anchor_text = tokenizer.decode(self._anchor, skip_special_tokens=False) if self.stop else ""

    def __bool__(self) -> bool:
        return bool(self.stop)

    def may_end(self, token: int) -> bool:
        """False when appending `token` cannot complete a stop string (no decoding needed then)."""
        known = self._may_end.get(token)
        if known is None:
            known = self._may_end[token] = self._could_complete(token)
        return known

    def ends_with_stop(self, completion_ids: Sequence[int]) -> bool:
        """True when a stop string occurs in the decoded tail of `completion_ids`."""
        tail = self.tokenizer.decode(completion_ids[-self.window :], skip_special_tokens=False)
        return any(text in tail for text in self.stop)

    def cut(self, text: str) -> str:
        """`text` up to and including the earliest-ending stop string (unchanged without one)."""
        ends = [text.find(stop) + len(stop) for stop in self.stop if stop in text]
        return text[: min(ends)] if ends else text

    def _could_complete(self, token: int) -> bool:
        try:
            pair = self.tokenizer.decode(self._anchor + [token], skip_special_tokens=False)
        except Exception:  # noqa: BLE001 (an id beyond the tokenizer: decoding will say what it is)
            return True
        if not pair.startswith(self._anchor_text):
            return True  # a decoder that rewrites across tokens: do not guess
        added = pair[len(self._anchor_text) :]
        return not added or _UNDECODABLE in added or any(char in added for char in self._last_characters)
