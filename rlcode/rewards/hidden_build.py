"""Building hidden tests over the sandbox, and their cache file.

For each task (anything with ``task_id``, ``code``, ``test_list``, ``test_setup_code`` and
``entry_point``: ``rlcode.data.mbpp.MBPPTask`` is one) the reference solution runs twice:

1. on the pool's reference worker, computing each candidate input's value (``hidden_tests``: the
   template's got side); a timeout keeps the values that came before it, drops the input that was
   running and tries the rest again (twice at most);
2. as a *candidate* against the hidden asserts made from those values, in reverse order, through
   ``check_against_tests``, the path rewards take. Only the asserts that pass are kept, so every
   kept test passes on the reference by construction, as the reward judges it. This run is in
   another process (string hashes differ: a result that depends on set order of strings fails) and
   in the other order (a reference whose module state carries over between calls fails), so it is
   also the determinism check.

The reference is trusted, but runs in the sandbox anyway (it is arbitrary code from a data file).

Cache: ``$XDG_CACHE_HOME/rlcode/hidden_tests/<sha256 of the data file>.json`` (``~/.cache`` without
XDG_CACHE_HOME), holding the generator version, the seed and per task its tests or the reason it
has none. A cache of another generator version reads as absent. It is derived from the data's text:
keep it out of the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlcode.rewards.hidden_inputs import candidate_inputs, seed_for
from rlcode.rewards.hidden_tests import (GENERATOR_ERROR, MAX_HIDDEN, NO_NEW_INPUTS, REFERENCE_REJECTED,
                                         SANDBOX_ERROR, templates)
from rlcode.sandbox import Program, Status, plain_data
from rlcode.sandbox.verdict import check_against_tests

GENERATOR_VERSION = 1  # bump when a change would make other tests: old caches then read as absent
CANDIDATES = 3 * MAX_HIDDEN  # inputs tried per task (the reference drops some)
VERIFIED = MAX_HIDDEN + 5  # of those with a value, how many the second run checks
BUILD_TIMEOUT_S = 4.0  # per execution: the reference's values for all of a task's inputs
RETRIES = 2  # after a timeout, tries of the inputs not yet run


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rlcode" / "hidden_tests"


def file_sha256(path: os.PathLike | str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_path(data_sha256: str) -> Path:
    return cache_dir() / f"{data_sha256}.json"


def read_cache(data_sha256: str) -> dict | None:
    """The cache of this data file (``{"tasks": {task_id: {"tests": [...], "reason": ...}}, ...}``), or
    None when absent, unreadable or of another generator version."""
    try:
        cache = json.loads(cache_path(data_sha256).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(cache, dict) or cache.get("generator_version") != GENERATOR_VERSION:
        return None
    return cache


def write_cache(data_sha256: str, cache: dict) -> Path:
    path = cache_path(data_sha256)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(cache, sort_keys=True))
    partial.replace(path)  # readers never see half a file
    return path


def build(pool, tasks, seed: int = 0, threads: int = 8) -> dict:
    """Hidden tests of every task, as the cache holds them (``data_sha256`` is the caller's to add).
    ``threads``: tasks in flight (each waits on the pool most of its time)."""
    with ThreadPoolExecutor(threads) as executor:
        built = list(executor.map(lambda task: _guarded(pool, task, seed), tasks))
    return {"generator_version": GENERATOR_VERSION, "seed": seed, "max_per_task": MAX_HIDDEN,
            "tasks": {str(task.task_id): {"tests": tests, "reason": reason}
                      for task, (tests, reason) in zip(tasks, built)}}


def _guarded(pool, task, seed: int) -> tuple[list[str], str | None]:
    """One task's tests; a task the generator cannot handle (a bug, an odd record) costs that task
    alone, never the build."""
    try:
        return build_task(pool, task, seed)
    except Exception:
        return [], GENERATOR_ERROR


def build_task(pool, task, seed: int = 0) -> tuple[list[str], str | None]:
    """(the task's hidden tests, None) or ([], why it has none)."""
    found, reason = templates(task.test_list, task.entry_point or "")
    if not found:
        return [], reason
    inputs = candidate_inputs(found, random.Random(seed_for(task.task_id, seed)), CANDIDATES)
    if not inputs:
        return [], NO_NEW_INPUTS
    tags = {"task": str(task.task_id), "purpose": "hidden_tests"}
    try:
        values = reference_values(pool, task.code, task.test_setup_code,
                                  [template.probe(call) for template, call in inputs], tags)
    except Exception:  # the pool refused (closed, broken)
        return [], SANDBOX_ERROR
    made = [test for (template, call), value in zip(inputs, values)
            if value is not _NONE and (test := template.assert_for(call, value)) is not None]
    made = list(dict.fromkeys(made))[:VERIFIED]
    if not made:
        return [], REFERENCE_REJECTED
    checked = list(reversed(made))
    verdict = check_against_tests(pool, task.code, checked, task.test_setup_code,
                                  timeout=BUILD_TIMEOUT_S, tags=tags).result()
    if verdict.status == Status.INTERNAL_ERROR.value:
        return [], SANDBOX_ERROR
    passed = {test for test, ok in zip(checked, verdict.passed) if ok}
    kept = [test for test in made if test in passed][:MAX_HIDDEN]
    return (kept, None) if kept else ([], REFERENCE_REJECTED)


_NONE = object()  # no value: the probe raised, never ran, or sent what is not plain data


def reference_values(pool, code: str, setup: str, probes: list[str], tags: dict) -> list:
    """Each probe's value computed by the reference on the pool's reference worker, or ``_NONE``."""
    values = [_NONE] * len(probes)
    start = 0
    for _ in range(1 + RETRIES):
        pending = probes[start:]
        if not pending:
            break
        result = pool.submit(Program(code=code, probes=tuple(pending), setup=setup),
                             timeout=BUILD_TIMEOUT_S, tags=tags, reference=True).result()
        got = _decoded(result.probe_lines or (), len(pending))
        for offset, value in got.items():
            values[start + offset] = value
        if result.status is Status.OK or result.status in (Status.ERROR, Status.SYNTAX_ERROR) and not got:
            break  # done, or the reference itself does not run (setup or code failed)
        # Timed out or killed while running the first input without a value: skip it, run the rest.
        missing = next((i for i in range(len(pending)) if i not in got), None)
        if missing is None:
            break
        start += missing + 1
    return values


def _decoded(lines, count: int) -> dict[int, object]:
    """Probe index -> plain value; raised probes, malformed or repeated lines and Opaque values are
    left out (the reference is trusted, but a value must be data to be written as a literal)."""
    values: dict[int, object] = {}
    repeated = set()
    for line in lines:
        try:
            data = json.loads(line)
            index, value = data["i"], plain_data.decode(data["v"])
        except (ValueError, TypeError, KeyError, RecursionError, plain_data.DecodeError):
            continue
        if type(index) is not int or not 0 <= index < count:
            continue
        if index in values:
            repeated.add(index)
        values[index] = value
    return {i: v for i, v in values.items() if i not in repeated and not _opaque(v)}


def _opaque(value) -> bool:
    if isinstance(value, plain_data.Opaque):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return any(_opaque(item) for item in value)
    if isinstance(value, dict):
        return any(_opaque(k) or _opaque(v) for k, v in value.items())
    return False
