"""The allowed range of every numeric setting, checked on the parsed config before anything is built
(no model, no trainer, no run directory).

A negative learning rate or ``max_new_tokens: 0`` otherwise surfaces deep inside a step or an eval,
as a traceback after minutes, with a partial run directory left behind. The ranges are the settings'
own annotations (``rlcode.setting``) on the classes of the config's sections
(``rlcode.cli.sections``), so a key is checked exactly when the class has that setting:
``rlcode: model.learning_rate=-1e-05 is out of range: use a number > 0 (on the command line)``.
A value of None (the documented "off" or "default" of the optional ones) is not checked.
"""

from __future__ import annotations

from rlcode.cli.errors import UserError, locate
from rlcode.cli.sections import SECTIONS
from rlcode.setting import Range, ranges_of

# Lightning's own settings that rlcode's runs depend on (Lightning's signature carries no ranges).
LIGHTNING_RANGES = {"trainer.max_steps": Range(1, integer=True, also=(-1,), also_meaning="no limit")}


def ranges_for(config) -> dict[str, Range]:
    """Every numeric setting of the config's classes (the mode and data class it names), by key."""
    found = dict(LIGHTNING_RANGES)
    for section, classes in SECTIONS.items():
        chosen = _chosen_class(classes, value_at(config, section))
        if chosen is not None:
            found.update(ranges_of(chosen, section))
    return found


def check_ranges(config, argv: list[str]) -> None:
    """Raise a one-line ``UserError`` for the first setting outside its range."""
    for key, allowed in ranges_for(config).items():
        item = allowed.first_outside(value_at(config, key))
        if item is not None:
            where = locate(key.split("."), argv) or "in a config"
            raise UserError(f"{allowed.refusal(key, item)} ({where})")


def _chosen_class(classes: tuple[type, ...], node) -> type | None:
    """The section's class: its only one, or the one its ``class_path`` names (by class name)."""
    if len(classes) == 1:
        return classes[0]
    getter = getattr(node, "get", None)
    class_path = str((getter("class_path") if getter else None) or "")
    return next((cls for cls in classes if cls.__name__ == class_path.rsplit(".", 1)[-1]), None)


def value_at(config, dotted: str):
    """The parsed value at ``model.mode.num_generations`` (through a subclass's ``init_args``), or None."""
    node = config
    for part in dotted.split("."):
        node = _settings_of(node)
        if node is None:
            return None
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return node


def _settings_of(node):
    """A class given as ``{class_path, init_args}``: its settings; plain settings as they are."""
    if node is None:
        return None
    getter = node.get if hasattr(node, "get") else lambda key, default=None: getattr(node, key, default)
    if getter("class_path") is not None and getter("init_args") is not None:
        return getter("init_args")
    return node
