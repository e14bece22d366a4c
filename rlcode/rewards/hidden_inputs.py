"""New calls of a task's function: its visible asserts' templates with mutated literal arguments.

Each new call takes a template (in turn over the task's templates), mutates a random non-empty
subset of its literal arguments (``rlcode.rewards.mutation``, 1-3 operations each, with the values
the other templates pass in the same place as the pool), and is kept when it is new (not an
asserted call, not made before) and within ``size_bound``.

Length ties: many MBPP functions take a sequence and its length (``f(arr, n)``, ported from C). An
int argument equal, in every template, to the length of another argument is not mutated but set to
that argument's new length, so the pair stays consistent; when the sequence is written as code
(``[Pair(1, 2), ...]``, kept as written), the int is kept too.

Deterministic for a ``random.Random``: ``seed_for`` derives a task's seed from its id and a global
seed with sha256 (``hash()`` of a string changes per process).
"""

from __future__ import annotations

import hashlib
import random

from rlcode.rewards.hidden_tests import MAX_ARGUMENT_CHARS, Template, literal_text
from rlcode.rewards.mutation import mutate, size, size_bound


def seed_for(task_id, global_seed: int) -> int:
    """A task's mutation seed: the same on every machine and Python process (not ``hash()``)."""
    digest = hashlib.sha256(f"{global_seed}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def candidate_inputs(found: list[Template], rng: random.Random, count: int) -> list[tuple[Template, str]]:
    """Up to ``count`` new calls (template, call text), in generation order, none equal to an
    asserted call or to one another."""
    seen = {t.call(t.args, t.keywords) for t in found}
    pools = _pools(found)
    ties = [_ties(template, found) for template in found]
    result: list[tuple[Template, str]] = []
    for attempt in range(count * 10):
        if len(result) >= count:
            break
        index = attempt % len(found)
        template = found[index]
        places = [("arg", i) for i, (kind, _) in enumerate(template.args)
                  if kind == "value" and i not in ties[index]]
        places += [("kw", i) for i, (_, (kind, _)) in enumerate(template.keywords) if kind == "value"]
        if not places:
            continue
        chosen = [p for p in places if rng.random() < 0.5] or [rng.choice(places)]
        args, keywords = list(template.args), list(template.keywords)
        for where, i in chosen:
            original = args[i][1] if where == "arg" else keywords[i][1][1]
            pool = [v for v in pools.get((index, where, i), ()) if v != original]
            value = original
            for _ in range(rng.choice((1, 1, 2, 3))):
                value = mutate(value, rng, pool)
            if size(value) > size_bound(original) or literal_text(value, MAX_ARGUMENT_CHARS) is None:
                break
            if where == "arg":
                args[i] = ("value", value)
            else:
                keywords[i] = (keywords[i][0], ("value", value))
        else:
            for i, partner in ties[index].items():
                if args[partner][0] == "value":
                    args[i] = ("value", len(args[partner][1]))
            call = template.call(args, keywords)
            if call not in seen:
                seen.add(call)
                result.append((template, call))
    return result


def _signature(template: Template) -> tuple:
    return len(template.args), tuple(name for name, _ in template.keywords)


def _ties(template: Template, found: list[Template]) -> dict[int, int]:
    """Int argument -> the argument whose length it is in every template of this signature."""
    alike = [t for t in found if _signature(t) == _signature(template)]
    ties = {}
    for i, (kind, value) in enumerate(template.args):
        if kind != "value" or type(value) is not int:
            continue
        for j in range(len(template.args)):
            if j != i and all(len(t.lengths) > j and t.lengths[j] is not None and t.args[i][0] == "value"
                              and t.args[i][1] == t.lengths[j] for t in alike):
                ties[i] = j
                break
    return ties


def _pools(found: list[Template]) -> dict[tuple, list]:
    """Per (template, place): the values templates with the same signature pass there."""
    pools: dict[tuple, list] = {}
    for index, template in enumerate(found):
        for other in found:
            if _signature(other) != _signature(template):
                continue
            for i, (kind, value) in enumerate(other.args):
                if kind == "value":
                    pools.setdefault((index, "arg", i), []).append(value)
            for i, (_, (kind, value)) in enumerate(other.keywords):
                if kind == "value":
                    pools.setdefault((index, "kw", i), []).append(value)
    return pools
