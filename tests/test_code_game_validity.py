"""The code game's validity rule: every known way to win without writing interesting code is refused
with a reason naming the rule, ordinary deterministic code stays valid with its exact output, the
predictor's answer format carries every valid output, and the guard never raises."""

from __future__ import annotations

import pytest

from rlcode.envs import code_game
from rlcode.envs.code_game import (FORMAT_RESERVE_TOKENS, CodeGameEnv, ProgramCheck, _judge, check_program,
                                   extract_prediction, output_budget)
from rlcode.envs.pure_source import impurity
from rlcode.envs.writable_output import output_problem

CPU_BUDGET = 128  # configs/code_game.yaml's max_new_tokens


@pytest.fixture(scope="module")
def pool():
    from rlcode.sandbox import SandboxPool

    with SandboxPool(workers=2, timeout=20.0) as built:
        yield built


@pytest.fixture(scope="module")
def tiny_tokenizer():
    from rlcode.models import load_tokenizer

    return load_tokenizer("tiny-random")


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from rlcode.models import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")  # the embedded model's tokenizer only (no weights)


# Output the predictor cannot write.
UNWRITABLE = {
    "1000 tokens of output": ("print('ab' * 1000)", "output too long for the predictor: 2000 bytes > budget 112"),
    "a code fence in the output": ("print('`' * 3 + 'python')", "output contains a code fence"),
    "special-token text in the program": ("print('<|im_end|>')",
                                          "the program's text contains special-token text '<|im_end|>'"),
    "special-token text built at run time": ("print('<' + '|im_end|>')",
                                             "output contains special-token text '<|im_end|>'"),
    "a code fence in the program": ("s = '```'\nprint(len(s))", "the program's text contains a code fence"),
    "a control character": ("print('a' + chr(0) + 'b')", "control character '\\x00'"),
    "2**1000": ("print(2 ** 1000)", "output too long for the predictor: 302 bytes > budget 112"),
}
# Output that depends on the machine, not the code (both runs would agree on most of them).
MACHINE = {
    "working directory": ("import os\nprint(os.getcwd())", "uses os (not a pure-computation module)"),
    "boot id": ("print(open('/proc/sys/kernel/random/boot_id').read())", "calls open (reads files"),
    "scratch root ctime": ("import os\nprint(int(os.stat('/tmp').st_ctime))", "uses os "),
    "scratch root ctime through pathlib": ("import pathlib\nprint(pathlib.Path('/tmp').stat().st_ctime)",
                                           "uses pathlib (not a pure-computation module)"),
    "init's start time": ("print(open('/proc/1/stat').read().split()[21])", "calls open"),
    "boot time": ("print([l for l in open('/proc/stat') if l.startswith('btime')])", "calls open"),
    "device number": ("import os\nprint(os.stat('.').st_dev)", "uses os "),
    "minute of the hour": ("import time\nprint(time.gmtime().tm_min)", "uses time (not a pure-computation module)"),
    "hour since the epoch": ("import time\nprint(int(time.time()) // 3600)", "uses time "),
    "cpu count": ("import os\nprint(os.cpu_count())", "uses os "),
    "cpu count through multiprocessing": ("import multiprocessing\nprint(multiprocessing.cpu_count())",
                                          "uses multiprocessing "),
    "python version": ("import sys\nprint(sys.version)", "uses sys (not a pure-computation module)"),
    "python version through platform": ("import platform\nprint(platform.python_version())", "uses platform "),
    "a directory listing": ("import os\nprint(len(os.listdir('/usr/lib')))", "uses os "),
    "from-import of os": ("from os import getcwd\nprint(getcwd())", "uses os "),
    "os.path": ("import os.path\nprint(os.path.abspath('.'))", "uses os.path "),
}
# Deterministic, but no reader can work the value out.
INFEASIBLE = {
    "seeded random": ("import random\nrandom.seed(7)\nprint(random.randint(0, 10 ** 9))", "uses random "),
    "a digest": ("import hashlib\nprint(hashlib.sha256(b'x').hexdigest())", "uses hashlib "),
}
# Ways from a permitted name to a refused one.
EVASIONS = {
    "__import__": ("print(__import__('os').getcwd())", "calls __import__ (runs text as code)"),
    "eval": ("print(eval('1 + 1'))", "calls eval"),
    "exec": ("exec('print(1)')", "calls exec"),
    "getattr": ("import typing\nprint(getattr(typing, 'sys').version)", "calls getattr"),
    "a module inside a pure module": ("import typing\nprint(typing.sys.version)", "uses sys through typing"),
    "random inside statistics": ("import statistics\nprint(statistics.random.random())",
                                 "uses random through statistics"),
    "a module as a value": ("import typing\nprint('{0}'.format(typing))", "uses the module typing as a value"),
    "attribute access in a format string": ("def f():\n    pass\nprint('{0.__globals__}'.format(f))",
                                            "reads attributes ({0.x})"),
    "a computed format string": ("f = '{}'\nprint(f.format(1))", "format string that is not a literal"),
    "__builtins__": ("print(__builtins__.open)", "uses __builtins__"),
    "subclasses": ("print(().__class__.__base__.__subclasses__())", "reads __subclasses__"),
    "function globals": ("def f():\n    pass\nprint(f.__globals__)", "reads __globals__"),
    "a generator's frame": ("def g():\n    yield 1\nprint(g().gi_frame)", "reads gi_frame"),
    "a match pattern reading attributes": ("def f():\n    pass\nmatch f:\n    case object(__globals__=g):\n"
                                           "        print(g)", "reads __globals__"),
    "typing's string evaluation": ("from typing import get_type_hints", "uses get_type_hints"),
    "operator.attrgetter": ("import operator\nprint(operator.attrgetter('sys')(1))", "uses attrgetter"),
    "a private attribute of the library": ("import re\nprint(re._compiler)", "reads the private attribute _compiler"),
    "an address": ("print(id(1))", "calls id (prints an object's memory address)"),
    "input": ("print(input())", "calls input"),
    "star import": ("from math import *\nprint(pi)", "imports * from math"),
    "a string annotation singledispatch evaluates": (  # the error message would hold the directory
        "from functools import singledispatch\n@singledispatch\ndef f(x):\n    pass\ntry:\n    @f.register\n"
        "    def _(x: \"__import__('os').getcwd()\"):\n        pass\nexcept Exception as e:\n    print(e)",
        "has a string annotation (typing tools evaluate it as code)"),
    "pseudo-random draws in statistics": ("import statistics\nprint(statistics.NormalDist().samples(2, seed=1))",
                                          "uses samples (draws pseudo-random numbers"),
}
ATTACKS = {**UNWRITABLE, **MACHINE, **INFEASIBLE, **EVASIONS}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_every_attack_is_invalid_with_the_rule_named(pool, name):
    code, reason = ATTACKS[name]
    check = check_program(code, timeout=2.0, pool=pool, max_output_tokens=CPU_BUDGET)
    assert not check.valid and check.output is None and reason in check.reason, (name, check)


@pytest.mark.parametrize("code, output", [
    ("total = 0\nfor i in range(1, 11):\n    if i % 3 == 0:\n        total += i\nprint(total)", "18"),
    ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib(15))", "610"),
    ("s = 'hello world'\nprint(s[::-1].title())\nprint(sorted('the quick brown fox'.split(), key=len))",
     "Dlrow Olleh\n['the', 'fox', 'quick', 'brown']"),
    ("import math\nprint(math.gcd(84, 36), math.comb(10, 3), round(math.sqrt(2), 4))", "12 120 1.4142"),
    ("from collections import Counter\nprint(Counter('mississippi').most_common(2))", "[('i', 4), ('s', 4)]"),
    ("from functools import lru_cache, reduce\nimport itertools\n@lru_cache(None)\ndef steps(n):\n"
     "    return 0 if n == 1 else 1 + steps(n // 2 if n % 2 == 0 else 3 * n + 1)\n"
     "print(steps(27), reduce(lambda a, b: a * b, range(1, 6)), len(list(itertools.permutations('abc'))))",
     "111 120 6"),
    ("class Counter:\n    def __init__(self):\n        self._n = 0\n    def tick(self):\n        self._n += 1\n"
     "        return self._n\nc = Counter()\nc.tick()\nprint(c.tick(), type(c).__name__)", "2 Counter"),
    ("from dataclasses import dataclass\nfrom enum import Enum\nclass Suit(Enum):\n    HEART = 1\n"
     "@dataclass\nclass Card:\n    rank: int\n    suit: Suit\nprint(Card(3, Suit.HEART), Suit.HEART.value)",
     "Card(rank=3, suit=<Suit.HEART: 1>) 1"),
    ("from collections import namedtuple\nP = namedtuple('P', 'x y')\nprint(P(1, 2)._replace(x=3))", "P(x=3, y=2)"),
    ("print('{:>5}|{:<3}|'.format(42, 'a'))\nprint(f'{3.14159:.2f}')\nprint('trailing   ')",
     "   42|a  |\n3.14\ntrailing"),
    ("import re\nfrom fractions import Fraction\nprint(re.findall(r'\\d+', 'a1b22c333'), Fraction(3, 12))",
     "['1', '22', '333'] 1/4"),
    ("if __name__ == '__main__':\n    print(sorted({3, 1, 2}))", "[1, 2, 3]"),
])
def test_ordinary_deterministic_programs_are_valid_with_their_output(pool, code, output):
    check = check_program(code, timeout=2.0, pool=pool, max_output_tokens=CPU_BUDGET)
    assert check == ProgramCheck(True, output, ""), check


def test_the_token_budget_is_the_predictors_tokens_less_the_format(pool, tiny_tokenizer):
    """With the predictor's tokenizer the bound is its token count; without one, one byte per token."""
    assert output_budget(CPU_BUDGET) == CPU_BUDGET - FORMAT_RESERVE_TOKENS == 112
    assert output_budget(512) == 496 and output_budget(16) == 8  # the reserve is at most half the answer
    code = "for _ in range(10):\n    print('return a + b')"  # 129 bytes, 69 tiny-random tokens
    text = "\n".join(["return a + b"] * 10)
    assert len(text.encode()) == 129 and len(tiny_tokenizer.encode(text, add_special_tokens=False)) == 69
    assert check_program(code, pool=pool, tokenizer=tiny_tokenizer, max_output_tokens=CPU_BUDGET).valid
    without = check_program(code, pool=pool, max_output_tokens=CPU_BUDGET)
    assert "129 bytes > budget 112 (no tokenizer given: one token per byte)" in without.reason
    long = check_program("print('ab' * 1000)", pool=pool, tokenizer=tiny_tokenizer, max_output_tokens=CPU_BUDGET)
    assert long.reason == "output too long for the predictor: 2000 tokens > budget 112"
    assert check_program(code, pool=pool, tokenizer=tiny_tokenizer, max_output_tokens=80).reason == \
        "output too long for the predictor: 69 tokens > budget 64"


def test_the_budget_boundary_is_inclusive():
    class OneTokenPerCharacter:
        def encode(self, text, add_special_tokens=False):
            return list(text)

    budget = output_budget(CPU_BUDGET)
    assert output_problem("x" * budget, tokenizer=OneTokenPerCharacter(), max_output_tokens=CPU_BUDGET) == ""
    assert output_problem("x" * (budget + 1), tokenizer=OneTokenPerCharacter(), max_output_tokens=CPU_BUDGET) == \
        f"output too long for the predictor: {budget + 1} tokens > budget {budget}"
    assert output_problem("x" * budget, max_output_tokens=CPU_BUDGET) == ""
    assert "bytes > budget" in output_problem("é" * (budget // 2 + 1), max_output_tokens=CPU_BUDGET)


def test_smollm2_tokenizer_budget_and_added_tokens(pool, smollm2_tokenizer):
    """SmolLM2 spends 1000 tokens on 'ab' * 1000, and its added tokens (StarCoder's <filename>, ...)
    are special-token text although no generic pattern knows them."""
    long = check_program("print('ab' * 1000)", pool=pool, tokenizer=smollm2_tokenizer, max_output_tokens=512)
    assert long.reason == "output too long for the predictor: 1000 tokens > budget 496"
    code = "print('<file' + 'name>')"
    assert check_program(code, pool=pool, max_output_tokens=CPU_BUDGET).valid  # no tokenizer: nothing to know
    check = check_program(code, pool=pool, tokenizer=smollm2_tokenizer, max_output_tokens=CPU_BUDGET)
    assert check.reason == ("output contains special-token text '<filename>', which the predictor can neither "
                            "read nor write")
    fine = check_program("print(sum(range(100)))", pool=pool, tokenizer=smollm2_tokenizer, max_output_tokens=CPU_BUDGET)
    assert fine == ProgramCheck(True, "4950", "")


def test_a_valid_program_renders_as_text_in_the_predictors_prompt(pool, tiny_tokenizer):
    """The predictor's prompt of a valid program holds no end-of-turn id but the template's own."""
    game = CodeGameEnv(pool, theme="strings", timeout=2.0, tokenizer=tiny_tokenizer, max_output_tokens=CPU_BUDGET)
    game.reset(0)
    turn = game.step("```python\nprint('im_end' + '|>')\n```")
    ids = tiny_tokenizer.apply_chat_template(turn.next_turn.messages, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids.count(tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")) == 1


def test_the_second_run_differs_in_what_reading_cannot_see(pool, monkeypatch):
    """With the static rule switched off, the two runs still tell apart the working directory, the
    home directory, the time zone and the CPU set (the sandbox shows this process's CPUs or fewer)."""
    monkeypatch.setattr(code_game, "impurity", lambda code: "")
    for code in ("import os\nprint(os.getcwd())", "import os\nprint(os.environ['HOME'])",
                 "import time\nprint(time.localtime(0).tm_hour)"):
        check = check_program(code, timeout=2.0, pool=pool, max_output_tokens=CPU_BUDGET)
        assert check.reason == "not deterministic: the two runs printed different output", (code, check)
    from rlcode.sandbox import Program

    code = "import os\nprint(len(os.sched_getaffinity(0)))"
    shown = int(pool.submit(Program(code)).result().stdout)  # how many CPUs the sandbox shows
    cpus = check_program(code, pool=pool, max_output_tokens=CPU_BUDGET)
    assert cpus.reason == ("not deterministic: the two runs printed different output" if shown > 1 else ""), cpus


@pytest.mark.parametrize("output", ["3", "python\n3", "  indented\n\nblank line inside", "<output>x</output>",
                                    "a `b` c", "\tTabbed", "line\n``\nx"])
def test_the_answer_format_carries_every_valid_output(output):
    """The last fenced block's body, taken whole, is the prediction: any fence-free output round-trips,
    even one whose first line looks like a language tag."""
    assert extract_prediction(f"```\n{output}\n```") == output
    assert extract_prediction(f"I think:\n```python\nprint(1)\n```\nso it prints\n```\n{output}\n```") == output
    assert extract_prediction(f"```text\n{output}\n```") == output
    assert extract_prediction(f"```\n{output}\n") == output  # cut at the stop string: no closing fence
    assert extract_prediction(output) == output


@pytest.mark.parametrize("code", [
    "", "   \n", "\x00", "print(1)\x00", "print('a')" + "\n" * 100_000, "(" * 10_000, "x = " + "-" * 100_000 + "1",
    "print('\\udcff')", "print('\udcff')", "def f(:\n", "import", "from . import x", "print('" + "é" * 5000 + "')",
    "import math\nprint(math.sys)", "print(" + "1 + " * 5000 + "1)", "x = " + "-" * 16_000 + "1",
    "raise SystemExit(0)", "print(end='')",
    "print('x' * 10_000_000)", "print('\\x1b[31mred')", "print(' ' * 1000)",
])
def test_the_guard_never_raises(pool, code):
    check = check_program(code, timeout=2.0, pool=pool, max_output_tokens=CPU_BUDGET)
    assert not check.valid and check.output is None and check.reason, (code[:40], check)


def test_the_guard_survives_odd_inputs_and_tokenizers(pool):
    class Broken:
        all_special_tokens = property(lambda self: 1 / 0)

        def encode(self, text, add_special_tokens=False):
            raise RuntimeError("no")

    check = check_program("print(1)", pool=pool, tokenizer=Broken(), max_output_tokens=CPU_BUDGET)
    assert check == ProgramCheck(True, "1", "")  # the byte bound stands in for the broken tokenizer
    assert check_program(None, pool=pool).reason == "no program"
    assert impurity("print('\udcff')")  # a lone surrogate in the source: an answer, not an exception
    bad_utf8 = {"code": 0, "out": "\ufffd", "utf8": False, "long": False, "err": ""}
    assert _judge([bad_utf8, bad_utf8]).reason == "output is not valid UTF-8, which the predictor cannot write"


def test_a_closed_pool_is_a_verdict_not_an_exception():
    from rlcode.sandbox import SandboxPool

    closed = SandboxPool(workers=1, timeout=5.0)
    closed.close()
    check = check_program("print(1)", pool=closed)
    assert not check.valid and check.reason.startswith("sandbox: ")


def test_a_budget_without_room_for_an_output_is_refused(pool):
    with pytest.raises(ValueError, match="max_output_tokens=1 leaves no room for an output"):
        CodeGameEnv(pool, theme="x", max_output_tokens=1)
    assert CodeGameEnv(pool, theme="x", max_output_tokens=2).max_output_tokens == 2  # one token of output


def test_the_static_rule_answers_every_mutation_of_a_program():
    """Random cuts, splices and odd characters in real programs: the static rule returns a string for
    each (no exception), and the output rule likewise for arbitrary text."""
    import random

    sources = [code for code, _ in ATTACKS.values()] + ["def f(n):\n    return [i * i for i in range(n)]\nprint(f(4))"]
    odd = ["\x00", "\udcff", "é", "\u2028", "(", ")", ":", "\n", "    ", "'", '"""', "\\", "{0.x}", "<|", "|>", "```"]
    rng = random.Random(0)
    for _ in range(600):
        text = rng.choice(sources)
        for _ in range(rng.randint(1, 4)):
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(odd + [rng.choice(sources)[:rng.randint(0, 30)]]) + text[at:]
        if rng.random() < 0.3:
            text = text[:rng.randint(0, len(text))]
        assert isinstance(impurity(text), str)
        assert isinstance(output_problem(text, max_output_tokens=CPU_BUDGET), str)


@pytest.mark.parametrize("code, reason", [
    ("def reverse(input):\n    return input[::-1]\nprint(reverse('abc'))", ""),  # a parameter named input
    ("def g():\n    id = 3\n    def h():\n        return id\n    return h()\nprint(g())", ""),  # an enclosing local
    ("f = lambda hash: hash * 2\nprint(f(21))", ""),
    ("print(open('/proc/1/stat').read())\nopen = print", "calls open"),  # the use comes before the rebinding
    ("class A:\n    x = open('/proc/1/stat').read()\n    open = 1\nprint(A.x)", "calls open"),
    ("def f():\n    global open\n    return open('/proc/1/stat').read()\nprint(f())", "calls open"),
    ("def f(x):\n    return x\nprint(f(id)(1))", "calls id"),
])
def test_a_builtins_name_counts_only_where_it_means_the_builtin(code, reason):
    assert (impurity(code) or "").startswith(reason) and bool(impurity(code)) == bool(reason), impurity(code)


def test_the_static_rule_refuses_few_mbpp_reference_solutions():
    """Ordinary code: of MBPP's 974 reference solutions (functions written for the benchmark, not for
    this game) the static rule refuses 10, each for a real dependence on the machine or an unchecked
    format string: sys.maxsize / sys.getsizeof (8), datetime (1), a format string held in a variable (1)."""
    import collections

    from rlcode.data.mbpp import load_mbpp

    refused = collections.Counter(impurity(task.code).split(" (")[0] for task in load_mbpp(split="all")
                                  if impurity(task.code))
    assert refused == collections.Counter({"uses sys": 8, "uses datetime": 1,
                                           "formats with a format string that is not a literal or reads attributes": 1})
