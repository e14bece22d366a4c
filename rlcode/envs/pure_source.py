"""Is a game program's output a function of its source alone? The static half of the code game's rule.

A reader can predict a program only from its text. Anything the program learns from the machine
(files, the clock, the working directory, cpu count, the interpreter's version, addresses) makes the
output unknowable even when two runs agree, so :func:`impurity` refuses, by reading the program's
syntax tree in the trusted parent (it never runs the program):

* imports of any module outside :data:`PURE_MODULES` (each listed with why it is pure); ``os``,
  ``sys``, ``time``, ``pathlib``, ``platform``, ``socket``, ``subprocess``, ``io`` and the rest are
  out. ``random`` and ``hashlib`` are out too: a seeded PRNG draw or a digest is deterministic but no
  reader can work it out, so under a zero-sum reward it is a free win that leaves the predictor
  with no signal. Huge exact results (``2**10000``) stay legal here and are refused by the output's
  token budget instead;
* builtins that read the machine or run text as code (:data:`REFUSED_BUILTINS`: ``open``,
  ``input``, ``eval``, ``exec``, ``__import__``, ``getattr``, ``id``, ``hash``, ``globals``, ...);
* the ways from a permitted object to a refused one: dunder attributes other than
  :data:`SAFE_DUNDERS` (``__globals__``, ``__subclasses__``, ``__dict__``, ...), frame and traceback
  attributes, a module's attribute that is itself a module outside the list (``typing.sys``,
  ``statistics.random``), a module used as a value instead of ``module.name``, private (``_x``)
  attributes the program does not define itself, attribute lookups by string
  (``operator.attrgetter``, ``string.Formatter``, ``typing.get_type_hints``, ``str.format`` with a
  format string that is not a literal or whose fields read attributes, ``{0.x}``), string
  annotations (``functools.singledispatch`` evaluates them with ``eval``), and the pseudo-random
  draws a permitted module offers (``statistics.NormalDist.samples``).

Why reading decides, not running: two runs on one machine see the same boot id, ``/proc`` times,
``sys.version``, cpu count and directory listings, and ``os.getcwd``, ``os.stat`` and
``os.cpu_count`` raise no audit event a runtime hook could refuse. The two runs with different hash
seeds, clocks, directories and CPU sets (``rlcode.envs.code_game``) back the rule up for what
reading cannot see, such as printed addresses and set order. It is a filter against a writer that
learns what wins, not a sandbox (the sandbox confines the program either way); a route it misses
is a bug to add here, with a test.
"""

from __future__ import annotations

import ast
import importlib
import string
import symtable
import types
import warnings

from rlcode.sandbox.asserts import MAX_PARSED_ASCII, MAX_PARSED_OTHER

PURE_MODULES = {
    "math": "functions of numbers", "cmath": "functions of complex numbers",
    "itertools": "iterator algebra over the program's own values",
    "functools": "higher-order functions (reduce, lru_cache, partial)",
    "operator": "operators as functions (attrgetter and methodcaller are refused)",
    "collections": "containers", "collections.abc": "container interfaces",
    "heapq": "heap operations on lists", "bisect": "binary search on lists",
    "string": "character-class constants and Template (Formatter is refused)",
    "re": "regular expressions on the program's strings",
    "fractions": "exact rational arithmetic", "decimal": "decimal arithmetic (the default context is fixed)",
    "statistics": "statistics of the program's numbers", "numbers": "numeric abstract classes",
    "dataclasses": "class boilerplate", "typing": "annotations (get_type_hints and ForwardRef are refused)",
    "enum": "enumerations", "copy": "copies of the program's objects", "textwrap": "text layout",
    "array": "typed arrays of numbers",
}

REFUSED_BUILTINS = {
    **dict.fromkeys(("__import__", "eval", "exec", "compile"), "runs text as code"),
    **dict.fromkeys(("open", "input", "breakpoint", "help"), "reads files, input or a terminal"),
    **dict.fromkeys(("globals", "locals", "vars", "dir"), "lists the interpreter's namespaces"),
    **dict.fromkeys(("getattr", "hasattr", "setattr", "delattr"), "looks attributes up by computed names"),
    "id": "prints an object's memory address",
    "hash": "object hashes depend on addresses and the hash seed",
    **dict.fromkeys(("copyright", "credits", "license"), "prints the interpreter's own text"),
}
SAFE_DUNDERS = frozenset({
    "__init__", "__new__", "__post_init__", "__name__", "__qualname__", "__class__", "__doc__", "__repr__",
    "__str__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__len__", "__iter__", "__next__",
    "__getitem__", "__setitem__", "__delitem__", "__contains__", "__add__", "__sub__", "__mul__", "__call__",
    "__enter__", "__exit__", "__bool__"})
SAFE_DUNDER_NAMES = frozenset({"__name__", "__doc__", "__debug__", "__class__"})
# Frame, traceback and code objects lead to any module's globals.
_INTERNAL_ATTRIBUTES = frozenset({"tb_frame", "tb_next", "f_back", "f_globals", "f_locals", "f_builtins", "f_code",
                                  "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code"})
# Attribute lookups by string, and typing's evaluation of string annotations (eval).
_LOOKUP_BY_STRING = frozenset({"attrgetter", "methodcaller", "Formatter", "get_type_hints", "ForwardRef",
                               "vformat", "get_field", "_evaluate", "_eval_type"})
# Pseudo-random draws inside a permitted module (statistics.NormalDist.samples seeds a random.Random).
_PSEUDO_RANDOM = frozenset({"samples"})
# Public names that start with an underscore (namedtuple's API, enum's hooks).
_PUBLIC_UNDERSCORE = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_value_", "_name_",
                                "_missing_", "_generate_next_value_", "_ignore_", "_order_"})


def impurity(code: str) -> str:
    """Why ``code``'s output may depend on more than its source ("" when the rule holds). Never raises."""
    try:
        return _impurity(code)
    except Exception as e:  # a guard must answer, never crash the game
        return f"could not be checked ({type(e).__name__})"


def _impurity(code: str) -> str:
    limit = MAX_PARSED_ASCII if code.isascii() else MAX_PARSED_OTHER
    if len(code) > limit:
        return f"program too long to check ({len(code)} characters > {limit})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(code)
    except (SyntaxError, ValueError) as e:  # ValueError: null bytes
        return f"not valid Python ({getattr(e, 'msg', None) or e})"
    except (RecursionError, MemoryError):
        return "not valid Python (nested too deeply)"
    modules: dict[str, types.ModuleType] = {}  # names the program binds to modules
    for node in ast.walk(tree):
        problem = _import_problem(node, modules)
        if problem:
            return problem
    problem = _builtin_problem(code)
    if problem:
        return problem
    own = _own_attributes(tree)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        problem = _node_problem(node, modules, own, parents)
        if problem:
            return problem
    return ""


def _import_problem(node: ast.AST, modules: dict) -> str:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name not in PURE_MODULES:
                return f"uses {alias.name} (not a pure-computation module)"
            bound = alias.asname or alias.name.split(".")[0]
            modules[bound] = importlib.import_module(alias.asname and alias.name or bound)
    elif isinstance(node, ast.ImportFrom):
        if node.level or node.module not in PURE_MODULES:
            return f"uses {node.module or 'a relative import'} (not a pure-computation module)"
        source = importlib.import_module(node.module)
        for alias in node.names:
            if alias.name == "*":
                return f"imports * from {node.module} (name what is used)"
            problem = _attribute_problem(source, alias.name, set())
            if problem:
                return problem
            value = getattr(source, alias.name, None)
            if isinstance(value, types.ModuleType):
                modules[alias.asname or alias.name] = value
    return ""


def _own_attributes(tree: ast.AST) -> set[str]:
    """Attribute names the program defines itself (so ``self._cache`` is its own business)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _builtin_problem(code: str) -> str:
    """A refused builtin's name used where it means the builtin. A function's own parameter or local
    called ``input`` or ``id`` is the program's business (a function's locals are local for its whole
    body, and a free name is an enclosing function's local); at module or class level any use counts,
    since there a later assignment does not stop an earlier use from reaching the builtin."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pending = [symtable.symtable(code, "<program>", "exec")]
    except SyntaxError as e:  # what only the compiler's later passes see (`nonlocal x` at module level)
        return f"not valid Python ({e.msg})"
    while pending:
        table = pending.pop()
        pending.extend(table.get_children())
        in_function = table.get_type() == "function"
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if name not in REFUSED_BUILTINS or not symbol.is_referenced():
                continue
            if in_function and (symbol.is_parameter() or symbol.is_local() or symbol.is_free()):
                continue
            return f"calls {name} ({REFUSED_BUILTINS[name]})"
    return ""


def _node_problem(node: ast.AST, modules: dict, own: set, parents: dict) -> str:
    if isinstance(node, ast.Name):
        if node.id.startswith("__") and node.id not in SAFE_DUNDER_NAMES:
            return f"uses {node.id} (the interpreter's internals)"
    for annotation in _annotations(node):  # typing tools (functools.singledispatch) eval string annotations
        if any(isinstance(part, ast.Constant) and isinstance(part.value, str) for part in ast.walk(annotation)):
            return "has a string annotation (typing tools evaluate it as code)"
    if isinstance(node, ast.MatchClass):  # `case C(attr=...)` reads attributes by name
        for attr in node.kwd_attrs:
            problem = _attribute_problem(None, attr, own)
            if problem:
                return problem
    if isinstance(node, ast.Attribute):
        problem = _attribute_problem(_module_of(node.value, modules), node.attr, own)
        if problem:
            return problem
        if node.attr in ("format", "format_map") and not _literal_format(node.value):
            return "formats with a format string that is not a literal or reads attributes ({0.x})"
    module = _module_of(node, modules) if isinstance(node, (ast.Name, ast.Attribute)) else None
    if module is not None:
        parent = parents.get(id(node))
        if not (isinstance(parent, ast.Attribute) and parent.value is node):
            return f"uses the module {module.__name__} as a value (write {module.__name__}.name)"
    return ""


def _annotations(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.arg):
        return [node.annotation] if node.annotation is not None else []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [node.returns] if node.returns is not None else []
    if isinstance(node, ast.AnnAssign):
        return [node.annotation]
    return []


def _attribute_problem(module: types.ModuleType | None, attr: str, own: set) -> str:
    if attr.startswith("__") and attr.endswith("__") and attr not in SAFE_DUNDERS:
        return f"reads {attr} (the interpreter's internals)"
    if attr in _INTERNAL_ATTRIBUTES:
        return f"reads {attr} (frames lead to the interpreter's internals)"
    if attr in _LOOKUP_BY_STRING:
        return f"uses {attr} (looks attributes up or evaluates code by string)"
    if attr in _PSEUDO_RANDOM:
        return f"uses {attr} (draws pseudo-random numbers, which no reader can work out)"
    if attr.startswith("_") and not attr.startswith("__") and attr not in own and attr not in _PUBLIC_UNDERSCORE:
        return f"reads the private attribute {attr}"
    if module is not None:
        value = getattr(module, attr, None)
        if isinstance(value, types.ModuleType) and value.__name__ not in PURE_MODULES:
            return f"uses {value.__name__} through {module.__name__} (not a pure-computation module)"
    return ""


def _module_of(node: ast.AST, modules: dict) -> types.ModuleType | None:
    """The module an expression names (``re``, ``collections.abc``), else None."""
    if isinstance(node, ast.Name):
        return modules.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _module_of(node.value, modules)
        value = getattr(owner, node.attr, None) if owner is not None else None
        return value if isinstance(value, types.ModuleType) else None
    return None


def _literal_format(node: ast.AST) -> bool:
    """A literal format string whose fields name arguments but read no attributes."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    try:
        pending = [node.value]
        while pending:
            for _, field, spec, _ in string.Formatter().parse(pending.pop()):
                if field is not None and "." in field:
                    return False
                if spec:
                    pending.append(spec)
    except ValueError:  # a malformed format string fails at run time anyway
        return True
    return True
