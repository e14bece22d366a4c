"""Turning a conversation or a plain text into the exact string the model continues."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

Message = dict[str, str]
PromptInput = Union[str, Sequence[Message]]


def render_prompt(tokenizer, messages_or_text: PromptInput, chat: bool) -> str:
    """Render a prompt as text, ending where the model's answer begins.

    Args:
        tokenizer: a transformers tokenizer (needs a chat template when `chat` is True).
        messages_or_text: a list of {"role", "content"} messages, or a plain string (taken as one
            user message in chat mode).
        chat: apply the tokenizer's chat template with the assistant turn opened; otherwise the
            text is used as is (messages are then joined by blank lines).
    """
    if isinstance(messages_or_text, str):
        messages = [{"role": "user", "content": messages_or_text}]
    else:
        messages = list(messages_or_text)
    if not chat:
        if isinstance(messages_or_text, str):
            return messages_or_text
        return "\n\n".join(message["content"] for message in messages)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"{type(tokenizer).__name__} has no chat template: use chat=False (plain prompts) or an instruct model."
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class ChatPrompt(str):
    """A conversation kept as messages, for a server that applies its own chat template.

    Backends that send chat messages (``rollout_backend: openai`` with ``api: chat``, a served
    opponent) get this instead of a rendered prompt; it is still a ``str`` (its text lists the
    messages) so rollout logs, rewards and episode records handle it like any prompt.
    """

    messages: list[Message]

    def __new__(cls, messages_or_text: PromptInput) -> ChatPrompt:
        if isinstance(messages_or_text, ChatPrompt):
            return messages_or_text
        if isinstance(messages_or_text, str):
            messages = [{"role": "user", "content": messages_or_text}]
        else:
            messages = [dict(message) for message in messages_or_text]
        prompt = super().__new__(cls, "\n\n".join(f"[{m['role']}] {m['content']}" for m in messages))
        prompt.messages = messages
        return prompt
