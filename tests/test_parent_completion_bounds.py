"""The trusted parent's work on a completion's text is linear and bounded.

Before, extracting code from 400 KB of blank lines took over a minute (a ``^\\s*`` pattern under
MULTILINE rescans every following line), and finding the names a program binds parsed programs of
any size (8 MB: 4.1 GB and 13-20 s). The bounds are shown by work counted, not time: the Python
steps extraction runs, and the sizes the parent hands to ``ast.parse``.
"""

from __future__ import annotations

import ast
import re
import sys
import tracemalloc

import pytest

from rlcode.envs.code_game import extract_prediction
from rlcode.rewards import extraction
from rlcode.rewards.extraction import extract_code
from rlcode.sandbox import SandboxPool
from rlcode.sandbox.asserts import (MAX_PARSED_ASCII, MAX_PARSED_OTHER, bound_names_among,
                                    overridable_names)
from rlcode.sandbox.verdict import check_against_tests

FENCE = "```"
HONEST = "def add(a, b):\n    return a + b"


def _python_steps(function, *args) -> int:
    """Python lines run inside ``rlcode.rewards.extraction`` during the call. Each C-level call the
    module makes (``find``/``rfind`` from a position that only moves on, one regex match within one
    line's bounds) scans text once, so these steps bound the work up to a term linear in the text."""
    steps = 0

    def local(frame, event, arg):
        nonlocal steps
        steps += event == "line"
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename == extraction.__file__ else None

    sys.settrace(calls)
    try:
        function(*args)
    finally:
        sys.settrace(None)
    return steps


# Each was quadratic (or worse) before: n characters of these cost the old regexes O(n^2) steps.
ATTACKS = {
    "blank lines": lambda n: "\n" * n,
    "whitespace lines": lambda n: " \t\n" * (n // 3),
    "backticks without a newline": lambda n: "`" * n,
    "a fence tag without a newline": lambda n: FENCE + "a" * n,
    "def on one line": lambda n: "def " * (n // 4),
    "unclosed [BEGIN]s": lambda n: "[BEGIN]" * (n // 7),
    "blank lines after [DONE]": lambda n: HONEST + "\n[DONE]" + "\n" * n,
    "honest code then blank lines": lambda n: HONEST + "\n" * n,
}


@pytest.mark.parametrize("name", ATTACKS)
def test_extraction_steps_do_not_grow_with_text_without_markers(name):
    """Guards the extraction scan: text with no more markers costs the same Python steps at 8x the
    size (the C-level scans are single forward passes)."""
    small, large = ATTACKS[name](8_000), ATTACKS[name](64_000)
    for entry_point in (None, "add"):
        assert _python_steps(extract_code, large, entry_point) == _python_steps(extract_code, small, entry_point)
    assert _python_steps(extract_prediction, large) == _python_steps(extract_prediction, small)


class _RegexWindows:
    """Stands in for the ``re`` module and the compiled patterns of ``rlcode.rewards.extraction``,
    recording the stretch of text each regex call may read: (newlines in it, its length)."""

    def __init__(self, monkeypatch):
        self.windows: list[tuple[int, int]] = []
        for name, value in vars(extraction).items():
            if isinstance(value, re.Pattern):
                monkeypatch.setattr(extraction, name, self._pattern(value))
        monkeypatch.setattr(extraction, "re", self)

    def _record(self, string, pos=0, endpos=None):
        end = len(string) if endpos is None else min(endpos, len(string))
        self.windows.append((string.count("\n", pos, end), end - pos))

    def _pattern(self, pattern):
        recorder = self

        class Recorded:
            def __getattr__(self, name):
                method = getattr(pattern, name)

                def call(*args, **kwargs):
                    text = args[1] if name in ("sub", "subn") else args[0]
                    recorder._record(text, *[a for a in args[1:3] if isinstance(a, int)][:2]
                                     if name not in ("sub", "subn") else ())
                    return method(*args, **kwargs)
                return call
        return Recorded()

    def compile(self, *args, **kwargs):
        return self._pattern(re.compile(*args, **kwargs))

    def __getattr__(self, name):  # re.sub(pattern, repl, text), re.search(pattern, text), ...
        attribute = getattr(re, name)
        if name in ("sub", "subn", "search", "match", "findall", "finditer", "fullmatch", "split"):
            def call(pattern, *args, **kwargs):
                flags = kwargs.pop("flags", 0)
                return getattr(self.compile(pattern, flags), name)(*args, **kwargs)
            return call
        return attribute


@pytest.mark.parametrize("name", ATTACKS)
def test_no_regex_reads_more_than_one_line(monkeypatch, name):
    r"""Guards the extraction scan: every regex call is confined to one line (a pattern that may read
    across newlines, as ``^\s*`` under MULTILINE does, rescans the lines that follow each line), and
    the regexes read at most the text's length three times over."""
    windows = _RegexWindows(monkeypatch)
    text = ATTACKS[name](64_000) + "\n" + FENCE + "python\n" + HONEST + "\n" + FENCE
    for entry_point in (None, "add", "missing"):
        extract_code(text, entry_point)
    extract_prediction(text)
    assert windows.windows and all(newlines == 0 for newlines, _ in windows.windows), name
    assert sum(length for _, length in windows.windows) <= 3 * 3 * len(text)


@pytest.mark.parametrize("unit", [FENCE + "\n", FENCE + "python\ndef f(\n", "[BEGIN]x[DONE]", "def f(\n",
                                  "[BEGIN]" + FENCE + "\n" + FENCE + "[DONE]", "  " + FENCE + "sh\n"])
def test_extraction_steps_grow_linearly_with_markers(unit):
    """Guards the scan's bookkeeping (each marker is searched for again only once passed): 8x the
    markers cost at most 8x the steps."""
    small, large = unit * 500, unit * 4_000
    assert _python_steps(extract_code, large, "add") <= 8 * _python_steps(extract_code, small, "add")


@pytest.mark.timeout(120)  # a regression would take hours here, not a failed assertion
def test_megabyte_attacks_beside_an_honest_answer():
    """At 2 MB (the old code: tens of minutes to hours each) every attack is extracted, and the honest
    answer beside it still is."""
    assert extract_code("Sure:\n" + FENCE + "python\n" + HONEST + "\n" + FENCE, "add") == HONEST
    for name, build in ATTACKS.items():
        code = extract_code(build(2_000_000), "add")
        assert code == HONEST if "honest" in name or "[DONE]" in name else HONEST not in code, name


# -- names a program binds -------------------------------------------------------------------------

TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert sum([add(1, 1)]) == 2",
         "assert (add(1, 1) == 2) == True"]


def _parsed_sizes(monkeypatch) -> list[int]:
    sizes, parse = [], ast.parse

    def recording(source, *args, **kwargs):
        sizes.append(len(source))
        return parse(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", recording)
    return sizes


def test_the_parent_parses_no_program_beyond_the_cap(monkeypatch):
    """Guards bound_names_among: an 8 MB program spelling the names the tests use (ASCII or not) is
    never parsed and the parent builds nothing proportional to it; beyond the cap every name spelt
    counts as bound (a superset), below it a program that rebinds ``sum`` is still found."""
    names = overridable_names(TESTS)
    assert names == {"sum"}  # True is a constant: spelling it no longer makes the parent parse
    sizes = _parsed_sizes(monkeypatch)
    assert bound_names_among(HONEST + "\nx = True\n", names) == frozenset() and sizes == []
    assert bound_names_among(HONEST + "\nsum = lambda v: 2\n", names) == {"sum"} and sizes
    assert bound_names_among(HONEST + "\nprint(sum([1]))\n# é\n", names) == frozenset()
    attacks = {"ascii": HONEST + "\nx = [sum, True]" * 500_000,
               "non-ascii": HONEST + "\nx = [ｓｕｍ, True]" * 500_000,
               "combining marks": "x" + "\u0301\u0316" * 4_000_000 + " = 1\n" + HONEST}
    for name, code in attacks.items():
        assert len(code) >= 8_000_000
        sizes.clear()
        tracemalloc.start()
        try:
            bound = bound_names_among(code, names)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert bound == {"sum"} and sizes == [], name
        assert peak < 1 << 20, (name, peak)  # before: 4.1 GB for 8 MB
    for cap, pad in ((MAX_PARSED_ASCII, "#"), (MAX_PARSED_OTHER, "é")):
        sizes.clear()
        at_cap = "sum = 1\n#" + pad * (cap - 9)
        assert len(at_cap) == cap and bound_names_among(at_cap, names) == {"sum"} and sizes == [cap]
        sizes.clear()
        assert bound_names_among(at_cap + pad, names) == {"sum"} and sizes == []


def test_an_oversized_program_beside_an_honest_one():
    """Guards the whole check: a 1 MB program that spells the tests' names is judged without the
    parent parsing it, and an honest sample in flight with it gets the verdict it gets alone."""
    big = HONEST + "\nx = [sum, True]" * 70_000 + "\n"
    with SandboxPool(workers=2, timeout=30.0) as pool:
        alone = check_against_tests(pool, HONEST, TESTS).result(timeout=120)
        futures = [check_against_tests(pool, code, TESTS) for code in (big, HONEST, big.replace("sum", "ｓｕｍ"))]
        verdicts = [future.result(timeout=300) for future in futures]
    assert alone.all_passed and (verdicts[1].passed, verdicts[1].reason) == (alone.passed, alone.reason)
    assert verdicts[0].status == "ok" and verdicts[0].all_passed  # same values, got sides in the child
    assert verdicts[2].status == "ok" and verdicts[2].all_passed
