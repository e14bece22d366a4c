"""Errors whose message is the whole report: the CLI prints them as ``rlcode: <message>``, no traceback."""

from __future__ import annotations


class SettingError(ValueError):
    """A setting that parsed but turns out wrong once the run builds its parts (an unknown reward
    name): the message names the key and the fix."""
