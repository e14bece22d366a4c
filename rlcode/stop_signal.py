"""Whether a stop signal has reached this process: asked by the loops that can give up early, below
the callbacks that own the signals (the HF decode loop; a training step after its collection and
before each micro-batch of its first update pass). ``callbacks/shutdown.py`` registers the source
while it holds the handlers. Nothing here decides across ranks: a caller that must agree with the
other ranks does so itself."""

from __future__ import annotations

from typing import Callable

_sources: list[Callable[[], bool]] = []


def watch(source: Callable[[], bool]) -> None:
    _sources.append(source)


def unwatch(source: Callable[[], bool]) -> None:
    if source in _sources:
        _sources.remove(source)


def asked() -> bool:
    return any(source() for source in _sources)
