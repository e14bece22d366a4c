"""Stop strings: the cheap candidate check never skips a step where a stop string completes, and
the HF backend cuts exactly where decoding every step would (also for strings split across tokens)."""

from __future__ import annotations

import pytest
import torch

from rlcode.models import load_model, load_tokenizer
from rlcode.rollout import HFGenerateBackend, SamplingParams, render_prompt
from rlcode.rollout.stop_strings import StopStringMatcher

TEXTS = [
    "def add(a, b):\n    return a + b\n```\n[DONE] café naïve — ok",
    "while index < len(items):\n    total += items[index]  # π ≈ 3.14\n",
    "print({'key': [1, 2, 3]})\n\n\nclass Stack:\n    pass\n",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def _first_stop_every_step(matcher: StopStringMatcher, ids: list[int]) -> int | None:
    """The old rule: decode the tail after every token; the first step where a stop string shows."""
    return next((step for step in range(len(ids)) if matcher.ends_with_stop(ids[: step + 1])), None)


def _first_stop_with_candidates(matcher: StopStringMatcher, ids: list[int]) -> int | None:
    return next((step for step in range(len(ids))
                 if matcher.may_end(ids[step]) and matcher.ends_with_stop(ids[: step + 1])), None)


def test_candidate_check_never_skips_a_completing_token(tokenizer):
    """Guards the shortcut: for every substring of 1-4 characters of code with multi-byte
    characters (byte-level tokens that decode to half a character), stopping with the candidate
    check happens at the same token as decoding after every token."""
    compared = 0
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        for width in range(1, 5):
            for start in range(0, len(text) - width + 1):
                matcher = StopStringMatcher(tokenizer, [text[start : start + width]])
                expected = _first_stop_every_step(matcher, ids)
                assert expected is not None
                assert _first_stop_with_candidates(matcher, ids) == expected, (text[start : start + width], text)
                compared += 1
    assert compared > 400


def test_candidate_check_skips_most_tokens(tokenizer):
    """The point of the shortcut: for "```" or "[DONE]" most tokens of code are not candidates."""
    ids = tokenizer.encode("".join(TEXTS), add_special_tokens=False)
    matcher = StopStringMatcher(tokenizer, ["```", "[DONE]"])
    candidates = sum(matcher.may_end(token) for token in ids)
    assert 0 < candidates < len(ids) / 4


@pytest.fixture(scope="module")
def model():
    return load_model("tiny-random").eval()


def test_backend_cuts_where_decoding_every_step_would(model, tokenizer):
    """Regression guard for the faster loop: greedy rows stop at the first token after which the
    decoded tail holds a stop string, one stop string spanning two tokens; the text is cut after it."""
    prompts = [render_prompt(tokenizer, text, chat=True) for text in ("def add(a, b):", "class Stack:", "x = [")]
    backend = HFGenerateBackend(model, tokenizer)
    full = backend.generate(prompts, 1, SamplingParams(temperature=0, max_new_tokens=24))
    rows = [full.completion_ids[row, : int(full.completion_mask[row].sum())].tolist() for row in range(3)]
    # A string made of the last character of one token and the first of the next, in row 0.
    pieces = [tokenizer.decode([token]) for token in rows[0]]
    split_at = next(i for i in range(2, len(pieces) - 1) if pieces[i] and pieces[i + 1] and
                    pieces[i][-1] + pieces[i + 1][0] not in "".join(pieces[:i]) + pieces[i])
    split = pieces[split_at][-1] + pieces[split_at + 1][0]
    other = full.completion_texts[2][4:7]
    stops = [split, other]
    assert split not in pieces[split_at] and split not in pieces[split_at + 1]  # really across tokens

    batch = backend.generate(prompts, 1, SamplingParams(temperature=0, max_new_tokens=24, stop=stops))
    matcher = StopStringMatcher(tokenizer, stops)
    hits = 0
    for row, ids in enumerate(rows):
        first = _first_stop_every_step(matcher, ids)
        length = len(ids) if first is None else first + 1
        assert int(batch.completion_mask[row].sum()) == length
        assert batch.completion_ids[row, :length].tolist() == ids[:length]
        text = tokenizer.decode(ids[:length], skip_special_tokens=True)
        assert batch.completion_texts[row] == (text if first is None else matcher.cut(text))
        hits += first is not None
    assert _first_stop_every_step(matcher, rows[0]) == split_at + 1  # row 0 ends on the split string
    assert hits >= 2


def test_same_seed_same_samples_with_stop_strings(model, tokenizer):
    """Sampled rows with stop strings are reproducible and end on a stop string or EOS or the limit."""
    prompts = [render_prompt(tokenizer, text, chat=True) for text in ("def add(a, b):", "class Stack:")]
    params = SamplingParams(temperature=1.0, max_new_tokens=20, stop=["(", "\n"], seed=5)
    backend = HFGenerateBackend(model, tokenizer)
    first, second = backend.generate(prompts, 3, params), backend.generate(prompts, 3, params)
    assert torch.equal(first.completion_ids, second.completion_ids)
    assert first.completion_texts == second.completion_texts
    matcher = StopStringMatcher(tokenizer, params.stop)
    for row in range(len(first)):
        ids = first.completion_ids[row, : int(first.completion_mask[row].sum())].tolist()
        stop_step = _first_stop_every_step(matcher, ids)
        assert stop_step in (None, len(ids) - 1)  # nothing after the first stop string
