"""The sandbox's structure: what runs inside imports only the stdlib, the parent side imports one
way, and a child sees the standard library but not the interpreter's site-packages."""

from __future__ import annotations

import ast
import os
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from rlcode.sandbox import SandboxPool, Status

SANDBOX = Path(__file__).resolve().parents[1] / "rlcode" / "sandbox"


def _imports(path: Path) -> set[str]:
    """Module names a file imports (relative imports as '.name')."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module:  # from .pool import ...
            names.add("." + node.module)
        elif isinstance(node, ast.ImportFrom):  # from . import cgroups
            names.update("." + alias.name for alias in node.names)
    return names


def test_code_inside_the_sandbox_imports_only_the_stdlib_and_its_siblings():
    """Guards the trust boundary: inside/ is loaded by path into a `python -I -S` worker; an rlcode
    or third-party import there would fail at run time or drag parent code into the sandbox."""
    siblings = {path.stem for path in (SANDBOX / "inside").glob("*.py")}
    for path in (SANDBOX / "inside").glob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top in sys.stdlib_module_names or top in siblings or name == "__future__", (path.name, name)


def test_parent_side_modules_import_without_a_circle():
    """Guards the one-way dependency pool -> worker_slot -> job_queue (worker_slot used to call the
    pool's private functions while the pool imported it)."""
    graph = {path.stem: {name.lstrip(".").split(".")[0] for name in _imports(path) if name.startswith(".")}
             for path in SANDBOX.glob("*.py")}
    assert "pool" not in graph["worker_slot"] and "pool" not in graph["job_queue"]

    def visit(module, trail):
        assert module not in trail, " -> ".join([*trail, module])
        for imported in graph.get(module, ()):
            visit(imported, [*trail, module])
    for module in graph:
        visit(module, [])


STDLIB = sysconfig.get_paths()["stdlib"]
PROBE = textwrap.dedent("""
    import importlib, sys
    sys.path[:0] = {paths!r}
    for name in ("pip", "pyseccomp"):
        try:
            importlib.import_module(name)
            print(name, "IMPORTED")
        except Exception as e:
            print(name, "unavailable", type(e).__name__)
    import json, decimal, sqlite3
    print("stdlib fine")
""")


@pytest.mark.parametrize("level", ["bwrap", "process"])
def test_children_see_the_standard_library_but_not_site_packages(level):
    """Guards item 5: the base interpreter's site-packages (pip) and the venv's (pyseccomp) stay out
    of reach unless the pool asks for them."""
    paths = [os.path.join(STDLIB, "site-packages"), sysconfig.get_paths()["purelib"]]
    with SandboxPool(workers=1, isolation=level) as pool:
        result = pool.submit(PROBE.format(paths=paths)).result()
    assert result.status is Status.OK, result.stderr
    assert "IMPORTED" not in result.stdout and "stdlib fine" in result.stdout, result.stdout
    if os.path.isdir(os.path.join(STDLIB, "site-packages", "pip")):
        with SandboxPool(workers=1, isolation=level, site_packages=True) as pool:
            allowed = pool.submit(PROBE.format(paths=paths[:1])).result()
        assert "pip IMPORTED" in allowed.stdout, allowed
