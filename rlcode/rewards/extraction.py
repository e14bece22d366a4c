"""Pull the program out of a model completion: fenced blocks, MBPP's [BEGIN]/[DONE], or raw text."""

from __future__ import annotations

import re

# An opening fence with an optional language tag, then everything up to the closing fence or the end
# (a completion cut by the token limit often never closes its block).
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_BEGIN_DONE = re.compile(r"\[BEGIN\](.*?)(?:\[DONE\]|\Z)", re.DOTALL)
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def completion_text(completion) -> str:
    """The text of a completion: a string, or TRL's conversational form (a list of messages whose
    content is a string or a list of {"type": "text", "text": ...} parts): assistant turns joined."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        messages = [m for m in completion if isinstance(m, dict)]
        chosen = [m for m in messages if m.get("role", "assistant") == "assistant"] or messages
        return "\n".join(_content_text(m.get("content")) for m in chosen)
    return "" if completion is None else str(completion)


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else str(content)


def code_blocks(text: str) -> list[str]:
    """Candidate programs in order of appearance: Python (or untagged) fenced blocks, else the text
    before a leading [DONE] and the [BEGIN]...[DONE] spans. Empty when the text has none of these."""
    fenced = [body for tag, body in _FENCE.findall(text) if tag.lower() in _PYTHON_TAGS]
    if fenced:
        return fenced
    spans = _BEGIN_DONE.findall(text)
    done, begin = text.find("[DONE]"), text.find("[BEGIN]")
    if done != -1 and (begin == -1 or done < begin):
        # The prompt ended in [BEGIN] (the MBPP paper's format): the answer is what precedes the first
        # [DONE]. A base model then often writes another task and its [BEGIN]...[DONE] span.
        spans.insert(0, text[:done])
    return spans


def extract_code(completion, entry_point: str | None = None) -> str:
    """The code to run for a completion.

    Args:
        completion: a string or a list of chat messages (see :func:`completion_text`).
        entry_point: the function the tests call; among several blocks the first one that defines it
            wins (models often show a usage example in a second block). Without it, or when no block
            defines it, the first block that defines any function, else the first block.
    Returns the raw text (stripped) when there is no block at all.
    """
    text = completion_text(completion)
    blocks = [b.strip("\n") for b in code_blocks(text)]
    blocks = [b for b in blocks if b.strip()]
    if not blocks:
        return _strip_stray_fences(text).strip("\n")
    if entry_point:
        defines = re.compile(rf"^\s*(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
        for block in blocks:
            if defines.search(block):
                return block
    any_def = re.compile(r"^\s*(?:async\s+)?def\s+\w+\s*\(", re.MULTILINE)
    return next((b for b in blocks if any_def.search(b)), blocks[0])


def _strip_stray_fences(text: str) -> str:
    # A base model answering the MBPP paper's prompt (which ends in [BEGIN]) writes its code, then
    # [DONE], then often more text: the program is what precedes the first [DONE]. Raw text that
    # still carries a closing fence would not parse either.
    text = text.split("[DONE]", 1)[0]
    return re.sub(r"^\s*```.*$", "", text, flags=re.MULTILINE)
