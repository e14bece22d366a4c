"""Can the predictor write this output? The code game's rule on outputs (and on the program's text).

See ``rlcode.envs.code_game`` for the rule in words. Everything here takes text a model wrote (or a
program printed) and answers with a reason, never an exception.
"""

from __future__ import annotations

import re
import unicodedata

FENCE = "```"
FORMAT_RESERVE_TOKENS = 16
"""Tokens of the predictor's ``max_new_tokens`` kept for the answer format: the opening and closing
fences (2-4 tokens in byte-level BPE tokenizers), the end-of-sequence token and a short lead-in such
as "The output is:" (4-6 tokens); at most half of ``max_new_tokens`` (smoke configs answer in 16)."""
DEFAULT_MAX_OUTPUT_TOKENS = 128
"""The CPU recipe's predictor ``max_new_tokens`` (configs/code_game.yaml), used when none is given."""
_SPECIAL_PATTERN = re.compile(r"<\|[^|\s'\"<>]{1,64}\|>")  # <|im_end|>, <|endoftext|>, <|eot_id|>, ...
_ALLOWED_CONTROLS = frozenset("\n\t")


def output_budget(max_output_tokens: int) -> int:
    """How many tokens an output may take when the predictor answers in ``max_output_tokens``."""
    return max_output_tokens - min(FORMAT_RESERVE_TOKENS, (max_output_tokens + 1) // 2)


def check_budget(max_output_tokens: int) -> None:
    """Refuse a budget that leaves no room for any output (a configuration error)."""
    if output_budget(max_output_tokens) < 1:
        raise ValueError(f"max_output_tokens={max_output_tokens} leaves no room for an output after the answer "
                         "format: give the predictor's max_new_tokens (at least 2)")


def special_strings(tokenizer) -> tuple[str, ...]:
    """The text of every added or special token of ``tokenizer`` (empty without one)."""
    if tokenizer is None:
        return ()
    found: set[str] = set()
    try:
        found.update(str(token) for token in getattr(tokenizer, "all_special_tokens", ()) or ())
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        found.update(getattr(token, "content", str(token)) for token in added.values())
    except Exception:  # an unusual tokenizer: the generic pattern still applies
        pass
    return tuple(sorted(text for text in found if text))


def text_problem(text: str, specials: tuple[str, ...], what: str) -> str:
    """Special-token text or a fence in ``text`` (the output, or the program shown in the prompt)."""
    if FENCE in text:
        return f"{what} contains a code fence ({FENCE}), which the answer format cannot carry"
    found = next((s for s in specials if s in text), None)
    match = _SPECIAL_PATTERN.search(text)
    if found is not None or match is not None:
        shown = found if found is not None else match.group(0)
        return f"{what} contains special-token text {shown!r}, which the predictor can neither read nor write"
    return ""


def output_problem(output: str, *, tokenizer=None, max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
                   specials: tuple[str, ...] | None = None) -> str:
    """Why the predictor cannot write ``output`` ("" when it can). Never raises."""
    try:
        return _output_problem(output, tokenizer, max_output_tokens,
                               special_strings(tokenizer) if specials is None else specials)
    except Exception as e:
        return f"output could not be checked ({type(e).__name__})"


def _output_problem(output: str, tokenizer, max_output_tokens: int, specials: tuple[str, ...]) -> str:
    control = next((c for c in output if c not in _ALLOWED_CONTROLS and unicodedata.category(c) in ("Cc", "Cs")),
                   None)
    if control is not None:
        return f"output contains the control character {control!r}, which the predictor cannot write"
    problem = text_problem(output, specials, "output")
    if problem:
        return problem
    budget = output_budget(max_output_tokens)
    tokens = _token_count(output, tokenizer)
    if tokens is not None:
        if tokens > budget:
            return f"output too long for the predictor: {tokens} tokens > budget {budget}"
        return ""
    size = len(output.encode("utf-8"))
    if size > budget:
        return (f"output too long for the predictor: {size} bytes > budget {budget} "
                "(no tokenizer given: one token per byte)")
    return ""


def _token_count(text: str, tokenizer) -> int | None:
    if tokenizer is None:
        return None
    try:
        return len(tokenizer.encode(text, add_special_tokens=False))
    except Exception:  # not a Hugging Face tokenizer: fall back to the byte bound
        return None
