"""Prompt formats for MBPP tasks: chat messages for instruct models, the MBPP paper's text for base models.

Both show the task's asserts, because MBPP's descriptions alone do not name the function or its
argument order; a completion that guesses another name fails every test however right it is.

- ``"chat"``: one user message, rendered later with the model's chat template. Measured on
  SmolLM2-135M-Instruct: 8.9% greedy pass rate on validation with this wording.
- ``"plain"``: the MBPP paper's zero-shot format ending in ``[BEGIN]``, for base models; its
  ``[DONE]`` marker is a natural stop sequence. Instruct models score 0% with it (they never
  close with ``[DONE]``), so use it only for base models.
"""

from __future__ import annotations

from typing import Literal, Union

from rlcode.data import humaneval
from rlcode.data.humaneval import HumanEvalTask
from rlcode.data.mbpp import MBPPTask

PromptFormat = Literal["chat", "plain"]
PROMPT_FORMATS: tuple[str, ...] = ("chat", "plain")
Messages = list[dict[str, str]]
Prompt = Union[str, Messages]

CHAT_TEMPLATE = (
    "You are an expert Python programmer. {text} Your code should pass these tests:\n\n{tests}\n\n"
    "Write the function in a ```python block."
)
PLAIN_TEMPLATE = (
    "You are an expert Python programmer, and here is your task: {text} "
    "Your code should pass these tests:\n\n{tests}\n[BEGIN]\n"
)
STOP_SEQUENCES: dict[str, list[str]] = {
    # A chat answer is over once its code block closes; the model tends to ramble on otherwise.
    "chat": ["\n```\n", "<|im_end|>"],
    "plain": ["[DONE]"],
}


def chat_messages(task: MBPPTask) -> Messages:
    """The single user message asking for the task's function in a ```python block."""
    return [{"role": "user", "content": CHAT_TEMPLATE.format(text=task.text.strip(), tests=_tests(task))}]


def plain_prompt(task: MBPPTask) -> str:
    """The MBPP paper's zero-shot prompt (Austin et al. 2021), answered up to ``[DONE]``."""
    return PLAIN_TEMPLATE.format(text=task.text.strip(), tests=_tests(task))


def build_prompt(task: MBPPTask | HumanEvalTask, prompt_format: PromptFormat = "chat") -> Prompt:
    """Messages (``"chat"``) or text (``"plain"``) for one task (HumanEval's: ``rlcode.data.humaneval``)."""
    if isinstance(task, HumanEvalTask):
        return humaneval.build_prompt(task, prompt_format)
    if prompt_format == "chat":
        return chat_messages(task)
    if prompt_format == "plain":
        return plain_prompt(task)
    raise ValueError(f"unknown prompt_format {prompt_format!r}: use one of {', '.join(PROMPT_FORMATS)}")


def length_order(prompts: list[Prompt]) -> list[int]:
    """Indices of ``prompts`` from shortest to longest (characters; ties keep their order).

    Evals generate in this order so that a batch holds prompts of similar length: one 740-token
    MBPP prompt among 170-token ones pads every row of its batch to 740 tokens. Greedy completions
    do not depend on their batch-mates (tests/test_eval_batching.py), so this changes speed only.
    """
    def length(prompt: Prompt) -> int:
        return len(prompt) if isinstance(prompt, str) else sum(len(m.get("content", "")) for m in prompt)

    return sorted(range(len(prompts)), key=lambda index: length(prompts[index]))


def _tests(task: MBPPTask) -> str:
    return "\n".join(test.strip() for test in task.test_list)
