"""What a setting says about itself beyond its type, default and help: its allowed numbers and whether
a resumed run may change it. One place per setting: the typed ``__init__`` parameter that is the
config key (litgpt's rule), written ``temperature: Annotated[float, fixed(POSITIVE)] = 0.7`` with its
help in the docstring.

Everything else is derived from these annotations: the CLI's range check before anything is built
(``rlcode.cli.ranges``), the settings a resume must keep (``rlcode.cli.resume_guard``), the help's
"allowed: ..." and "fixed on resume" (``rlcode.cli.help``), and the constructors' own checks for
Python callers (``check_arguments``).

Simplification: TRL keeps its settings in one ``GRPOConfig`` dataclass with field metadata. rlcode's
config surface is the classes' signatures (``model.X`` is the Learner's ``X``, ``model.mode.X`` the
mode's), so the metadata sits on those parameters instead of in a parallel dataclass that would be a
sixth table to keep in step.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal

from rlcode.errors import SettingError


@dataclass(frozen=True)
class Range:
    """Numbers from ``low`` to ``high`` (None: unbounded), each end included unless ``*_open``,
    plus the special values in ``also`` (e.g. -1: no limit)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    also: tuple = ()
    also_meaning: str = ""

    def allows(self, value) -> bool:
        if value in self.also:
            return True
        if isinstance(value, float) and math.isnan(value):
            return False
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def first_outside(self, value):
        """The first number of ``value`` (a number, or a list of them: ``eval.k``) outside the range, or
        None. Anything that is not a number (None: "off", a string) is not this check's."""
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, (int, float)) and not isinstance(item, bool) and not self.allows(item):
                return item
        return None

    def refusal(self, key: str, item) -> str:
        return f"{key}={item!r} is out of range: use {self.describe()}"

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            text = f"{kind} in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}" \
                   f"{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{kind} {'>' if self.low_open else '>='} {_num(self.low)}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {_num(self.high)}"
        else:
            text = f"any {'integer' if self.integer else 'number'}"
        extra = ", ".join(str(v) for v in self.also)
        return f"{text}, or {extra}{f' ({self.also_meaning})' if self.also_meaning else ''}" if extra else text


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
COUNT = Range(1, integer=True)  # a number of things that must exist: at least one
COUNT_OR_ZERO = Range(0, integer=True)  # 0 documented as "off" / "only at start and end"
PROBABILITY = Range(0, 1)
FRACTION_BELOW_ONE = Range(0, 1, high_open=True)
SEED = Range(0, integer=True)  # numpy's generators refuse negative seeds
ANY_NUMBER = Range()  # a penalty or bonus: any sign is meaningful
TEMPERATURE = NON_NEGATIVE  # 0: greedy (where a setting allows greedy; the policy's own must be > 0)
IMPORTANCE_CAP = Range(1)  # a cap below 1 would also shrink the weights of agreeing tokens

OnResume = Literal["fixed", "free", "as its holder"]


@dataclass(frozen=True)
class Setting:
    """``range``: the numbers allowed (None: not a number). ``on_resume``: "fixed" (a resumed run
    must keep it: it changes what a step computes), "free" (it changes where or how fast, or what is
    logged: a resume may change it), or "as its holder" (a field of a settings object, such as
    ``lora.r``: the field holding the object decides)."""

    range: Range | None = None
    on_resume: OnResume = "free"


def fixed(allowed: Range | None = None) -> Setting:
    return Setting(allowed, "fixed")


def free(allowed: Range | None = None) -> Setting:
    return Setting(allowed, "free")


def field_of(allowed: Range | None = None) -> Setting:
    """A field of a settings object (``model.lora``, ``model.vllm``): its resume rule is its holder's."""
    return Setting(allowed, "as its holder")


def settings_of(cls: type | Callable) -> dict[str, tuple[Setting | None, Any]]:
    """Each parameter of ``cls.__init__`` (or of a function): (its Setting or None, its bare type)."""
    function = cls.__init__ if isinstance(cls, type) else cls
    hints = typing.get_type_hints(function, include_extras=True)
    found = {}
    for name in inspect.signature(function).parameters:
        if name in ("self", "args", "kwargs"):
            continue
        setting, bare = _unwrap(hints.get(name))
        found[name] = (setting, bare)
    return found


def _unwrap(hint) -> tuple[Setting | None, Any]:
    """``Annotated[T, Setting]`` or ``Annotated[T, Setting] | None``: the Setting and ``T``."""
    if hasattr(hint, "__metadata__"):
        return next((m for m in hint.__metadata__ if isinstance(m, Setting)), None), hint.__origin__
    for arg in typing.get_args(hint):
        if hasattr(arg, "__metadata__"):
            return _unwrap(arg)
    return None, hint


def nested_settings_class(bare) -> type | None:
    """The settings dataclass a parameter holds (``LoraSettings | None``), or None."""
    for candidate in (bare, *typing.get_args(bare)):
        if dataclasses.is_dataclass(candidate) and isinstance(candidate, type):
            return candidate
    return None


def ranges_of(cls: type, prefix: str) -> dict[str, Range]:
    """``{"model.learning_rate": POSITIVE, "model.lora.r": COUNT, ...}`` for a class's settings,
    its settings objects' fields included."""
    return {key: setting.range for key, setting in settings_by_key(cls, prefix).items() if setting.range is not None}


def settings_by_key(cls: type, prefix: str, holder: OnResume = "free") -> dict[str, Setting]:
    """``{"model.lora.r": Setting(COUNT, "fixed"), ...}``: every annotated setting of a class and of
    its settings objects, a field's "as its holder" replaced by its holder's rule."""
    found = {}
    for name, (setting, bare) in settings_of(cls).items():
        if setting is None:
            continue
        if setting.on_resume == "as its holder":
            setting = Setting(setting.range, holder)
        found[f"{prefix}.{name}"] = setting
        nested = nested_settings_class(bare)
        if nested is not None:
            found.update(settings_by_key(nested, f"{prefix}.{name}", setting.on_resume))
    return found


def fixed_names(cls: type) -> tuple[str, ...]:
    """The settings of ``cls`` a resumed run must keep."""
    return tuple(name for name, (setting, _) in settings_of(cls).items()
                 if setting is not None and setting.on_resume == "fixed")


def out_of_range(cls: type | Callable, values: dict[str, Any], prefix: str = "") -> str | None:
    """The first of ``values`` outside its setting's range, as ``"prefix.name=value is out of range:
    use ..."``; None when every one is inside. A list is checked item by item; None is "off"."""
    for name, (setting, _) in settings_of(cls).items():
        if setting is None or setting.range is None or name not in values:
            continue
        item = setting.range.first_outside(values[name])
        if item is not None:
            return setting.range.refusal(f"{prefix}{name}", item)
    return None


def check_arguments(cls: type | Callable, values: dict[str, Any], prefix: str = "") -> None:
    """A constructor's own range check, for Python callers (the CLI checked before building): a
    ``SettingError`` (a ``ValueError``), which the CLI prints as one line."""
    problem = out_of_range(cls, values, prefix)
    if problem is not None:
        raise SettingError(problem)
