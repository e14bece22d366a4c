"""A mistake in a command or config reaches the user as at most three lines: what is wrong, where
(the key, the config file and line, or the command line) and the fix, with "did you mean" for a
misspelled key, class or value, and rlcode's key for a key of the scripts it replaces
(``rlcode.cli.seed_names``).

jsonargparse reports a parse error as the whole usage (70-115 lines) followed by a nested message;
a ValueError of a class's ``__init__`` surfaces as a traceback. ``explain_parse_error`` and
``explain_init_error`` turn the messages they produce into a ``UserError``, which ``rlcode.cli``
prints as ``rlcode: <message>``. ``--debug`` (or ``RLCODE_DEBUG=1``) keeps the full traceback.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlcode.cli.help import COMMANDS, DATA_CLASSES, MODE_CLASSES
from rlcode.cli.seed_names import seed_hint
from rlcode.training.learner import Learner

DEBUG_ENV = "RLCODE_DEBUG"
_DEBUG_HINT = "--debug shows the full message"


class UserError(Exception):
    """A mistake in the command or its configs; the message is the whole report (at most 3 lines)."""


def take_debug_flag(argv: list[str]) -> tuple[list[str], bool]:
    """(argv without ``--debug``, whether the full traceback was asked for by the flag or RLCODE_DEBUG)."""
    debug = "--debug" in argv or os.environ.get(DEBUG_ENV, "").lower() not in ("", "0", "false", "no")
    return [arg for arg in argv if arg != "--debug"], debug


def did_you_mean(word: str, candidates, prefix: str = "did you mean ") -> str:
    """``"did you mean X? "`` for the one candidate that ``word`` abbreviates (``--model.temp``: the
    command line no longer expands abbreviations), else the closest (difflib), or ``""`` when none is close."""
    candidates = list(candidates)
    extensions = [c for c in candidates if c.startswith(word)] if word else []
    match = extensions if len(extensions) == 1 else difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f"{prefix}{match[0]}? " if match else ""


# ---- where a key is set: the command line, or a config file and line ----------------------------------


def config_files(argv: list[str]) -> list[Path]:
    """The ``--config`` / ``-c`` files of a command line, in the order they apply."""
    files = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            files.append(Path(argv[i + 1]))
        elif arg.startswith("--config="):
            files.append(Path(arg.split("=", 1)[1]))
    return files


def locate(keys: list[str], argv: list[str]) -> str:
    """Where the setting ``keys`` (e.g. ["model", "learnig_rate"]) comes from, or "" when unknown."""
    dotted = ".".join(keys)
    for depth in range(len(keys), 0, -1):  # --model.lora '{rr: 4}' sets model.lora.rr
        flag = "--" + ".".join(keys[:depth])
        if any(arg == flag or arg.startswith(flag + "=") for arg in argv):
            return "on the command line" if depth == len(keys) else f"in {flag} on the command line"
    for path in reversed(config_files(argv)):  # the last file that sets it wins
        line = _yaml_line(path, keys)
        if line is not None:
            return f"{path}, line {line}"
    return f"key {dotted}" if len(keys) > 1 else ""


def _yaml_line(path: Path, keys: list[str]) -> int | None:
    try:
        node = yaml.compose(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for key in keys:
        found = _entry(node, key)
        if found is None:  # subclass mode: a class's settings may sit under init_args
            inner = _entry(node, "init_args")
            found = _entry(inner[1], key) if inner is not None else None
        if found is None:
            return None
        key_node, node = found
        line = key_node.start_mark.line + 1
    return line


def _entry(node, key: str):
    if not isinstance(node, yaml.MappingNode):
        return None
    return next(((k, v) for k, v in node.value if getattr(k, "value", None) == key), None)


# ---- jsonargparse's messages ------------------------------------------------------------------------


@dataclass
class _Line:
    indent: int
    text: str


def _lines(message: str) -> list[_Line]:
    out = []
    for raw in message.splitlines():
        text = raw.strip()
        if text.startswith("- "):
            text = text[2:]
        if text:
            out.append(_Line(len(raw) - len(raw.lstrip(" -")), text))
    return out


def _context(lines: list[_Line], target: int) -> tuple[list[str], str | None]:
    """(the parser keys enclosing line ``target``, the innermost class_path around it)."""
    stack: list[tuple[int, str, str]] = []
    for line in lines[: target + 1]:
        while stack and stack[-1][0] >= line.indent:
            stack.pop()
        key = re.match(r'Parser key "([^"]+)"', line.text)
        cls = re.match(r"Problem with given class_path '([^']+)'", line.text)
        if key:
            stack.append((line.indent, "key", key.group(1)))
        elif cls:
            stack.append((line.indent, "class", cls.group(1)))
    keys = [part for _, kind, value in stack if kind == "key" for part in value.split(".")]
    classes = [value for _, kind, value in stack if kind == "class"]
    return keys, classes[-1] if classes else None


def _find(lines: list[_Line], pattern: str):
    for index, line in enumerate(lines):
        match = re.search(pattern, line.text)
        if match:
            return index, match
    return None, None


def explain_parse_error(message: str, argv: list[str], subcommand_parsers: dict) -> UserError:
    """A jsonargparse parse error of ``rlcode <argv>`` as a short UserError."""
    command = next((arg for arg in argv if arg in subcommand_parsers), None)
    parser = subcommand_parsers.get(command)
    lines = _lines(message)
    help_hint = f"rlcode {command or ''} --help".replace("  ", " ")

    _, missing = _find(lines, r"Parser key \"config\": File does not exist: '([^']+)'")
    if missing:
        given = Path(missing.group(1))  # jsonargparse makes it absolute: say it as the user wrote it
        return _missing_config(next((p for p in config_files(argv) if p.absolute() == given), given))
    if re.search(r"Problems parsing config", message):
        return _yaml_syntax(argv, message)
    _, choice = _find(lines, r"invalid choice: '([^']*)'")
    if choice:
        return UserError(f"unknown command {choice.group(1)!r}\n  {did_you_mean(choice.group(1), COMMANDS)}"
                         f"Commands: {', '.join(COMMANDS)} (rlcode --help)")
    if 'expected "subcommand"' in message:
        return UserError(f"no command given\n  Commands: {', '.join(COMMANDS)}; e.g. rlcode fit --config "
                         "configs/quickstart.yaml (rlcode --help)")
    _, help_of = _find(lines, r"^--([\w.]+)\.help: (?:module '([\w.]+)' has no attribute '(\w+)'|.*: (\S+)$)")
    if help_of:  # rlcode fit --model.mode.help SPIRALL
        group, module, name, given = help_of.groups()
        return _unknown_class([group], given or f"{module}.{name}", argv, where=f"in --{group}.help")
    index, path = _find(lines, r"Expected a path but (\S+) either not accessible or invalid")
    if path:
        return _unknown_class(_context(lines, index)[0], path.group(1), argv)
    index, option = _find(lines, r"Option '([^']+)' is not accepted")
    if option:
        keys, cls = _context(lines, index)
        return _unknown_option([*keys, option.group(1)], cls, argv, command or "fit")
    index, expected = _find(lines, r"Expected an? (.+?)(?:\. Got value: (.*))?$")
    if expected and "Expected a <class 'NoneType'>" not in expected.group(0) and _context(lines, index)[0]:
        return _wrong_value(lines, index, argv, help_hint)
    _, no_value = _find(lines, r"argument (--[\w.]+): expected one argument")
    if no_value:
        return _missing_value(no_value.group(1), argv, help_hint)
    _, unknown = _find(lines, r"unrecognized arguments: (\S+)")
    if unknown:
        key = unknown.group(1).lstrip("-").split("=", 1)[0]
        return _unknown_key(key, "on the command line", parser, help_hint, flag=True)
    _, yaml_key = _find(lines, r"does not accept option '([^']+)'")
    if yaml_key:
        key = yaml_key.group(1)
        return _unknown_key(key, locate(key.split("."), argv) or "in a config", parser, help_hint, flag=False)
    return _fallback(lines, message, help_hint)


def _fallback(lines: list[_Line], message: str, help_hint: str) -> UserError:
    """A message of a kind not handled above: its most specific line, under the key it is about."""
    index = next((i for i, line in enumerate(lines) if _is_reason(line.text)
                  and not line.text.startswith(("Parser key", "Problem with given class_path"))), None)
    if index is None:
        reason = lines[0].text if lines else message.strip()
    else:
        keys, _ = _context(lines, index)
        reason = f"{'.'.join(keys)}: {lines[index].text}" if keys else lines[index].text
    return UserError(f"{reason}\n  Run {help_hint} for the accepted settings; {_DEBUG_HINT}")


def _missing_value(flag: str, argv: list[str], help_hint: str) -> UserError:
    """``--model.learning_rate -1e-5``: argparse reads a word starting with "-" as another flag, so the
    setting got no value. Say to join them with "=" (the way a negative number is given)."""
    index = argv.index(flag) if flag in argv else -1
    following = argv[index + 1] if 0 <= index < len(argv) - 1 else None
    if following is not None and following.startswith("-"):
        return UserError(f"{flag} got no value: {following!r} starts with '-' and was read as a flag\n"
                         f"  Write it with '=': {flag}={following}")
    return UserError(f"{flag} needs a value (on the command line)\n  e.g. {flag} VALUE or {flag}=VALUE ({help_hint})")


def _missing_config(path: Path) -> UserError:
    folder = path.parent if path.parent.is_dir() else Path("configs")
    names = sorted(p.name for p in folder.glob("*.y*ml")) if folder.is_dir() else []
    stems = {Path(name).stem: name for name in names}  # compared without the shared ".yaml"
    close = difflib.get_close_matches(path.stem, list(stems), n=1, cutoff=0.6)
    hint = (f"did you mean {folder / stems[close[0]]}? " if close
            else f"Configs in {folder}/: {', '.join(names)}. " if names else "")
    return UserError(f"config file {path} does not exist\n  {hint}Give the path of a YAML file to --config")


def _yaml_syntax(argv: list[str], message: str) -> UserError:
    for path in config_files(argv):
        try:
            yaml.safe_load(path.read_text())
        except OSError:
            continue
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark
            where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark else str(path)
            return UserError(f"{path} is not valid YAML: {error.problem} ({where})\n"
                             f"  Fix the YAML there{_context_of(error)}")
    first = message.strip().splitlines()[0]
    return UserError(f"a config does not parse: {first}\n  {_DEBUG_HINT}")


def _context_of(error) -> str:
    mark = getattr(error, "context_mark", None)
    return f" ({error.context} started at line {mark.line + 1})" if error.context and mark else ""


def _unknown_class(keys: list[str], given: str, argv: list[str], where: str = "") -> UserError:
    if keys[-1:] == ["mode"] and not given.startswith("{"):  # model.mode: a training mode's class
        keys = ["model.mode"]
    if len(keys) > 1 or given.startswith("{"):  # e.g. --model.lora '{r:4}': YAML needs a space after ':'
        dotted = ".".join(keys)
        return UserError(f"{dotted} cannot be {given!r} ({locate(keys, argv) or 'in a config'})\n"
                         f"  Give its settings as YAML with a space after each colon, --{dotted} '{{NAME: VALUE}}', "
                         f"or one at a time, --{dotted}.NAME VALUE")
    group = keys[0] if keys else "model.mode"
    known = DATA_CLASSES if group == "data" else MODE_CLASSES
    short = {path.rsplit(".", 1)[1]: path for path in known}
    suggestion = did_you_mean(given, known) or did_you_mean(given, short)
    where = where or locate(group.split("."), argv) or locate([*group.split("."), "class_path"], argv)
    return UserError(f"unknown {group} class {given!r} ({where or 'class_path'})\n"
                     f"  {suggestion}The {group} classes: {', '.join(known)}")


def _unknown_option(keys: list[str], class_path: str | None, argv: list[str], command: str) -> UserError:
    dotted = ".".join(keys)
    names = _init_parameters(class_path)
    owner = class_path.rsplit(".", 1)[-1] if class_path else keys[0]
    suggestion = seed_hint(dotted, flag=False) or (
        did_you_mean(keys[-1], names, prefix=f"did you mean {'.'.join(keys[:-1])}.") if names else "")
    where = locate(keys, argv)
    group = ".".join(keys[:-1])  # model, data, or model.mode
    listing = (f"rlcode {command} --{group}.help {class_path}" if group in ("model", "data", "model.mode") and class_path
               else f"rlcode {command} --help")
    return UserError(f"{dotted} is not a setting of {owner} ({where or 'in a config'})\n"
                     f"  {suggestion}Its settings: {listing}")


def _init_parameters(class_path: str | None) -> list[str]:
    """The ``__init__`` arguments a class accepts, through the ``**kwargs`` chain of its bases."""
    if not class_path:
        return []
    try:
        module, name = class_path.rsplit(".", 1)
        cls = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError, ValueError):
        return []
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names += [p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return names


def _unknown_key(key: str, where: str, parser, help_hint: str, flag: bool) -> UserError:
    known = _parser_keys(parser)
    dash = "--" if flag else ""
    suggestion = seed_hint(key, flag) or did_you_mean(key, known, prefix=f"did you mean {dash}")
    return UserError(f"{dash}{key} is not a setting ({where})\n  {suggestion}The settings: {help_hint}")


def _parser_keys(parser) -> list[str]:
    keys = []
    for action in getattr(parser, "_actions", []):
        keys += [option[2:] for option in action.option_strings if option.startswith("--")]
    return keys


def _wrong_value(lines: list[_Line], index: int, argv: list[str], help_hint: str) -> UserError:
    keys, _ = _context(lines, index)
    indent = lines[index].indent
    accepted, got = [], None
    for line in lines[index:]:
        if line.indent < indent and not line.text.startswith("Given value"):
            break
        expected = re.match(r"Expected an? (.+?)(?:\. Got value: (.*))?$", line.text)
        if expected and line.indent == indent:
            accepted += _readable_type(expected.group(1))
            got = got or expected.group(2)
        given = re.match(r"Given value: (.*)", line.text)
        if given and got is None:
            got = given.group(1)
    accepted = [a for a in dict.fromkeys(accepted) if a != "null"]
    literals = [a for a in accepted if a.startswith("'") or a[:1].isdigit() or a[:1] == "-"]
    dotted = ".".join(keys) or "a setting"
    suggestion = did_you_mean(str(got), [a.strip("'") for a in literals]) if got and literals else ""
    where = locate(keys, argv)
    return UserError(f"{dotted} cannot be {got!r} ({where or 'in a config'})\n"
                     f"  {suggestion}Use {' or '.join(accepted) or 'another value'} ({help_hint})")


def _readable_type(text: str) -> list[str]:
    """``typing.Literal['chat', 'plain']`` -> ["'chat'", "'plain'"]; ``<class 'int'>`` -> ["an int"]."""
    literal = re.fullmatch(r"typing\.Literal\[(.*)\]", text)
    if literal:
        return [value.strip() for value in literal.group(1).split(",")]
    cls = re.fullmatch(r"<class '(?:[\w.]+\.)?(\w+)'>", text)
    if cls:
        name = cls.group(1)
        return ["null"] if name == "NoneType" else [{"int": "an integer", "float": "a number", "bool": "true or false",
                                                      "str": "a string"}.get(name, f"a {name}")]
    return [text]


# ---- a class's own check of its settings (ValueError in __init__) ----------------------------------------


def explain_init_error(error: Exception, argv: list[str]) -> UserError:
    """A ValueError raised while the classes of the config are built, without jsonargparse's wrapping."""
    message = str(error)
    lines = _lines(message)
    reasons = [line.text for line in lines[1:] if _is_reason(line.text)]
    reason = reasons[0] if "Does not validate against any of the Union subtypes" in message and reasons \
        else (lines[0].text if lines else type(error).__name__)
    cls = re.search(r"class_path='([^']+)'", message)
    key = re.match(r"(?:model\.|data\.)?(\w+)=", reason)
    group = "data" if cls and cls.group(1) in DATA_CLASSES else "model"
    if group == "model" and key and key.group(1) not in inspect.signature(Learner.__init__).parameters:
        group = "model.mode"  # a mode's own check of its settings
    where = locate([*group.split("."), key.group(1)], argv) if key else ""
    context = [f"{group}: {cls.group(1)}"] if cls else []
    context += [where] if where else []
    return UserError(f"{reason}\n  ({'; '.join(context)})" if context else reason)


def _is_reason(text: str) -> bool:
    return not text.startswith(("Subtypes:", "Given value", "Expected a <class 'NoneType'>", "Errors:",
                                "Does not validate"))
