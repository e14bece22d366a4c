"""Test verdicts the candidate cannot game: the trusted parent decides every assert itself.

How one check runs (see ``rlcode.sandbox.asserts`` for the split):

1. Each test assert is split into parent-side structure and *probes* (the candidate-dependent
   subexpressions, e.g. ``f([3, 1])``). Expected sides stay in the parent.
2. The candidate's child runs ``code``, then the trusted ``setup``, then evaluates the probes; their
   values come back as plain data (exact builtin types; anything else is Opaque, equal to nothing).
   Probes naming nothing the candidate or setup binds (MBPP's ``sys.getsizeof((...))`` expected
   sides) run in a ``reference=True`` execution that never runs candidate code.
3. The parent substitutes the values and evaluates each assert. A missing probe (the program exited,
   timed out or crashed first) fails its test.

Exit codes, stdout and status lines are never evidence. Candidate code *can* write lines to the
values pipe (fd 3), so the channel is not unforgeable: what makes forging useless is that the
child only ever reports values, never verdicts, and never sees the values they are compared with.
A forged value passes only if it is the right answer. Two lines for the same probe fail its test.

The weaker path: an assert that is one probe as a whole (on MBPP only bare truth tests such as
``assert f(x)``, 12 of 4262, which have no expected side) is decided by the child's
``(not not (...))`` and must come back exactly ``True``; :attr:`TestVerdict.fallbacks` counts them.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from rlcode.sandbox import plain_data
from rlcode.sandbox.asserts import (MISSING, AssertParseError, AssertPlan, bound_names_among,
                                    evaluate_plan, overridable_names, plan_assert)
from rlcode.sandbox.inside.outcome import VALUE_LINES_SPARE
from rlcode.sandbox.launch import Limits
from rlcode.sandbox.plain_eval import EVAL_BUDGET_S
from rlcode.sandbox.result import ExecResult, Program, Status

_CONFLICT = plain_data.Opaque("conflicting values for one probe", raised=True)
_NO_REFERENCE = plain_data.Opaque("internal_error: the reference execution gave no value", raised=True)
_REFERENCE_CACHE: dict[tuple, dict[int, object]] = {}  # reference probes are deterministic
_REFERENCE_CACHE_MAX = 4096
DEFAULT_VALUES_BYTES = Limits().max_values_bytes  # fixed (not a pool setting)
REASON_CHARS = 400  # a verdict's reason and each test's detail (their parts are cut shorter still)
_cache_lock = threading.Lock()


@dataclass
class TestVerdict:
    """The parent's decision on one program against its tests."""

    __test__ = False  # not a pytest class

    passed: list[bool]
    status: str  # the candidate execution's Status value ("ok", "timeout", ...)
    reason: str  # "passed", "assert 2 failed: got [1, 2], expected [2, 1]", "timeout", ...
    result: ExecResult | None
    fallbacks: int = 0  # asserts decided by the child's exact-True truth test (see module doc)
    details: list[str] = field(default_factory=list)  # per test: "" when passed, else why

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def check_against_tests(pool, code: str, tests, setup: str = "", *, timeout: float | None = None,
                        tags: dict | None = None) -> "Future[TestVerdict]":
    """Run ``code`` against ``tests`` (assert strings) in ``pool``; the future never raises.

    Args:
        pool: a ``SandboxPool``.
        code: the candidate program.
        tests: assert statements, e.g. an MBPP ``test_list`` (plus ``challenge_test_list``).
        setup: trusted code run after ``code`` in the same globals (MBPP ``test_setup_code``).
        timeout: seconds for the candidate execution (the pool's default when None).
        tags: execution tags (run / step / task ids) passed to the pool.
    """
    verdict: Future = Future()
    tests = list(tests)
    try:
        plans = _plans(tests, code, setup)
        candidate_slots, reference_slots = _slots(plans)
        candidate_probes = tuple(plans[t].probes[p].source for t, p in candidate_slots)
        candidate = pool.submit(Program(code=code, probes=candidate_probes, setup=setup),
                                timeout=timeout, tags=tags)
        reference = _reference_values(pool, plans, reference_slots, tags)
    except Exception as e:  # the pool refused (closed, broken): a verdict, not an exception
        verdict.set_result(_internal_verdict(len(tests), f"{type(e).__name__}: {e}"))
        return verdict

    def finish(_=None):
        if verdict.done() or not candidate.done() or not reference.done():
            return
        try:
            verdict.set_result(_decide(plans, candidate_slots, candidate.result(), reference.result()))
        except Exception as e:  # a bug here must not lose the verdict
            if not verdict.done():
                verdict.set_result(_internal_verdict(len(tests), f"{type(e).__name__}: {e}"))

    candidate.add_done_callback(finish)
    reference.add_done_callback(finish)
    return verdict


def _plans(tests: list[str], code: str, setup: str) -> list[AssertPlan | None]:
    overridable = overridable_names(tests)  # the program's bindings matter only for these names
    names = bound_names_among(code, overridable) | bound_names_among(setup, overridable)
    plans = []
    for test in tests:
        try:
            plans.append(plan_assert(test, names))
        except AssertParseError:
            plans.append(None)  # a malformed test fails; it never crashes the check
    return plans


def _slots(plans) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(test index, probe index) pairs, split by where the probe runs."""
    candidate, reference = [], []
    for t, plan in enumerate(plans):
        for p, probe in enumerate(plan.probes if plan else ()):
            (reference if probe.reference else candidate).append((t, p))
    return candidate, reference


def _reference_values(pool, plans, slots, tags) -> Future:
    """Future of {slot position: value} for probes that must not meet candidate code."""
    done: Future = Future()
    if not slots:
        done.set_result({})
        return done
    probes = tuple(plans[t].probes[p] for t, p in slots)
    imports = sorted({name for probe in probes for name in probe.imports})
    program = Program(code="".join(f"import {name}\n" for name in imports),
                      probes=tuple(probe.source for probe in probes))
    key = (program.code, program.probes)
    with _cache_lock:
        cached = _REFERENCE_CACHE.get(key)
    if cached is not None:
        done.set_result(cached)
        return done
    execution = pool.submit(program, tags=tags, reference=True)

    def finish(_):
        try:
            result = execution.result()
            values = _probe_values(result, len(probes))
            if result.status is Status.OK and all(v is not MISSING for v in values.values()):
                with _cache_lock:
                    if len(_REFERENCE_CACHE) >= _REFERENCE_CACHE_MAX:
                        _REFERENCE_CACHE.clear()
                    _REFERENCE_CACHE[key] = values
            done.set_result(values)
        except Exception:
            done.set_result({})  # every reference probe missing: those tests fail

    execution.add_done_callback(finish)
    return done


def _probe_values(result: ExecResult, count: int) -> dict[int, object]:
    """Decode the child's probe lines; malformed lines are ignored, duplicated indices conflict."""
    values: dict[int, object] = {}
    for line in result.probe_lines or ():
        try:
            data = json.loads(line)
            index = data["i"]
            if type(index) is not int or not 0 <= index < count or set(data) != {"i", "v"}:
                continue
        except (ValueError, TypeError, KeyError, RecursionError):
            continue
        try:
            value = plain_data.decode(data["v"])
        except plain_data.LimitExceeded as e:  # well-formed but too costly to rebuild: fails its test
            value = plain_data.Opaque(f"value beyond the parent's limits ({e})", raised=True)
        except (ValueError, TypeError, KeyError, RecursionError, plain_data.DecodeError):
            continue
        values[index] = _CONFLICT if index in values else value
    return {i: values.get(i, MISSING) for i in range(count)}


def _decide(plans, candidate_slots, result: ExecResult, reference: dict) -> TestVerdict:
    child = _probe_values(result, len(candidate_slots))
    # Decoded: the verdict keeps no candidate values (N samples' verdicts held to the end of a run
    # would otherwise hold N values streams).
    result.probe_lines = []
    values: dict[tuple[int, int], object] = {}
    for position, slot in enumerate(candidate_slots):
        values[slot] = child[position]
    reference_slots = [(t, p) for t, plan in enumerate(plans) for p, probe in
                       enumerate(plan.probes if plan else ()) if probe.reference]
    for position, slot in enumerate(reference_slots):
        value = reference.get(position, MISSING)
        values[slot] = _NO_REFERENCE if value is MISSING else value
    passed, details, fallbacks = [], [], 0
    deadline = time.monotonic() + EVAL_BUDGET_S  # one budget for the whole check (see plain_eval)
    for t, plan in enumerate(plans):
        if plan is None:
            passed.append(False)
            details.append("test is not a single assert statement")
            continue
        fallbacks += plan.is_fallback
        outcome = evaluate_plan(plan, [values[(t, p)] for p in range(len(plan.probes))], deadline)
        passed.append(outcome.passed)
        details.append(outcome.detail)
    status = Status(result.status).value
    return TestVerdict(passed=passed, status=status, reason=_bounded(_reason(passed, details, result)),
                       result=result, fallbacks=fallbacks, details=[_bounded(d) for d in details])


def _bounded(text: str) -> str:
    """Every string a verdict carries is cut to REASON_CHARS: results files hold one per sample."""
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS - 3] + "..."


def _reason(passed: list[bool], details: list[str], result: ExecResult) -> str:
    if passed and all(passed):
        return "passed"  # every value judged was there, whatever was cut after it
    if result.values_over:  # what was cut may be what failed: say so rather than "missing"
        return (f"values over the {result.values_over} cap ({result.values_lines} lines, "
                f"{result.values_bytes} bytes written; kept: one line per probe + {VALUE_LINES_SPARE}, "
                f"{DEFAULT_VALUES_BYTES >> 20} MiB)")
    status = Status(result.status)
    if status is Status.ERROR and result.error_type:
        return f"error: {result.error_type}"
    if status is Status.INTERNAL_ERROR:
        return f"internal_error: {result.message}"[:120]
    if status is not Status.OK:
        return status.value
    first = next((i for i, ok in enumerate(passed) if not ok), None)
    if first is None:
        return "no tests"
    if details[first] == "exited before tests ran":
        return details[first]
    return f"assert {first + 1} failed: {details[first]}"


def _internal_verdict(count: int, message: str) -> TestVerdict:
    return TestVerdict(passed=[False] * count, status=Status.INTERNAL_ERROR.value,
                       reason=f"internal_error: {message}"[:120], result=None,
                       details=["internal_error"] * count)
