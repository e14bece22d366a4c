"""Pull the program out of a model completion: fenced blocks, MBPP's [BEGIN]/[DONE], or raw text.

Everything here runs in the trusted parent on text a model wrote, so every step is linear in the
text: markers are found by forward scans (``str.find`` from a position that only moves on), and the
one regex that remains per candidate program is matched within a single line's bounds. A pattern
such as ``^\\s*`` under MULTILINE is quadratic (``\\s`` crosses newlines, so each of n blank lines
rescans all that follow: 400 KB took over a minute); none is used.
"""

from __future__ import annotations

import re

FENCE, BEGIN, DONE = "```", "[BEGIN]", "[DONE]"
_PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_TAG = re.compile(r"[ \t]*([A-Za-z0-9_+-]*)")  # an opening fence's language tag (no newline in it)
_INDENT = " \t\f"


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
    if isinstance(content, (list, tuple)):
        return "".join(_plain_text(part.get("text") if isinstance(part, dict) else part) for part in content)
    return _plain_text(content)


def _plain_text(value) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def fenced_blocks(text: str, start: int = 0, end: int | None = None) -> list[tuple[str, str]]:
    """(language tag, body) of each fenced block in ``text[start:end]``, in order. A block runs from
    its opening line to the closing fence or ``end`` (a completion cut by the token limit often never
    closes its block); an opening fence needs a newline after its tag line."""
    end = len(text) if end is None else end
    blocks, position = [], start
    while (block := _fence_at(text, text.find(FENCE, position, end), end)) is not None:
        tag, body, position = block
        blocks.append((tag, body))
    return blocks


def _fence_at(text: str, opening: int, end: int) -> tuple[str, str, int] | None:
    """The block opened at ``opening`` (-1: none) as (tag, body, where scanning resumes), or None."""
    if opening < 0:
        return None
    newline = text.find("\n", opening + 3, end)
    if newline < 0:  # no line left to open a block with
        return None
    closing = text.find(FENCE, newline + 1, end)
    closing = end if closing < 0 else closing
    return _TAG.match(text, opening + 3, newline).group(1), text[newline + 1:closing], min(closing + 3, end)


def code_blocks(text: str) -> list[str]:
    """Candidate programs in the order they appear: the text before a [DONE] that comes before any
    other marker (the MBPP paper's prompt ends in [BEGIN], so the answer is what precedes [DONE]),
    Python (or untagged) fenced blocks, and [BEGIN]...[DONE] spans (a span holding fences stands for
    its Python blocks). Whichever marker comes first, its program comes first: a base model's answer
    ``CODE [DONE] prose ```...``` `` yields CODE before the fenced text. Empty when there is none."""
    end = len(text)
    blocks: list[str] = []
    position = 0
    first_done = text.find(DONE)
    if first_done >= 0 and text.find(FENCE, 0, first_done) < 0 and text.find(BEGIN, 0, first_done) < 0:
        blocks.append(text[:first_done])
        position = first_done + len(DONE)
    next_fence, next_begin = _find(text, FENCE, position), _find(text, BEGIN, position)
    while min(next_fence, next_begin) < end:
        if next_fence < next_begin:
            block = _fence_at(text, next_fence, end)
            if block is None:
                break  # a fence with no line after it: no block can open after it either
            tag, body, position = block
            blocks += _python_bodies([(tag, body)])
        else:
            body_start = next_begin + len(BEGIN)
            closing = text.find(DONE, body_start)
            body_end = end if closing < 0 else closing
            inner = fenced_blocks(text, body_start, body_end)
            blocks += _python_bodies(inner) if inner else [text[body_start:body_end]]
            position = end if closing < 0 else closing + len(DONE)
        # Each marker is searched for again only once passed, so the scan stays linear.
        if next_fence < position:
            next_fence = _find(text, FENCE, position)
        if next_begin < position:
            next_begin = _find(text, BEGIN, position)
    return blocks


def _find(text: str, marker: str, position: int) -> int:
    """Where ``marker`` next occurs, or past the end (never -1: a missing marker is not searched
    for again)."""
    found = text.find(marker, position)
    return len(text) + 1 if found < 0 else found


def _python_bodies(blocks: list[tuple[str, str]]) -> list[str]:
    return [body for tag, body in blocks if tag.lower() in _PYTHON_TAGS]


def defines_function(code: str, name: str | None = None) -> bool:
    """Whether a line of ``code`` begins (after indentation) ``def name(`` (``async def`` too; any
    name when None). Each occurrence of "def" is found by a forward scan and its line is matched
    once, within that line's bounds: linear in the code."""
    pattern = _DEF_ANY if name is None else re.compile(
        rf"[{_INDENT}]*(?:async[{_INDENT}]+)?def[{_INDENT}]+{re.escape(name)}[{_INDENT}]*\(")
    position = 0  # the start of a line not yet checked
    while True:
        hit = code.find("def", position)
        if hit < 0:
            return False
        line_start = code.rfind("\n", position, hit) + 1 or position
        line_end = code.find("\n", hit)
        line_end = len(code) if line_end < 0 else line_end
        if pattern.match(code, line_start, line_end):
            return True
        position = line_end + 1


_DEF_ANY = re.compile(rf"[{_INDENT}]*(?:async[{_INDENT}]+)?def[{_INDENT}]+\w+[{_INDENT}]*\(")


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
        for block in blocks:
            if defines_function(block, entry_point):
                return block
    return next((b for b in blocks if defines_function(b)), blocks[0])


def _strip_stray_fences(text: str) -> str:
    # A base model answering the MBPP paper's prompt (which ends in [BEGIN]) writes its code, then
    # [DONE], then often more text: the program is what precedes the first [DONE]. Raw text that
    # still carries a fence line would not parse either: such lines are blanked. Only lines holding
    # a fence are looked at, each once.
    text = text.split(DONE, 1)[0]
    pieces, position = [], 0  # position: where the text not yet copied starts
    hit = text.find(FENCE)
    while hit >= 0:
        line_start = text.rfind("\n", position, hit) + 1 or position
        line_end = text.find("\n", hit)
        line_end = len(text) if line_end < 0 else line_end
        blank = not text[line_start:hit].strip(_INDENT + "\r\v")
        pieces.append(text[position:line_start if blank else line_end])
        position = line_end
        hit = text.find(FENCE, line_end)
    pieces.append(text[position:])
    return "".join(pieces)
