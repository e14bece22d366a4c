"""Every shell and YAML snippet in README.md and docs/*.md is parsed or run here.

YAML blocks load with ``yaml.safe_load``; an rlcode config fragment (a ``model:``, ``data:``,
``trainer:`` ... section) is also parsed by the CLI on top of the quickstart config. Bash blocks pass
``bash -n``; each ``make TARGET`` names a Makefile target; each ``rlcode fit|validate|test`` command
line is parsed by the CLI with ``--print_config`` appended (nothing trains). Other commands (sbatch,
pip, rlcode-eval, python) are only syntax-checked.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.M | re.S)
CONFIG_SECTIONS = {"model", "data", "trainer", "run", "eval", "game_eval", "rollout_log", "checkpoint"}


def _blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text[:match.start()].count("\n") + 1
                found.append((f"{page.relative_to(REPO)}:{line}", match.group(2)))
    return found


def _commands(block: str) -> list[list[str]]:
    """The block's command lines as words (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", block)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


BASH = _blocks("bash")
YAML = _blocks("yaml")
RLCODE_COMMANDS = [(where, words) for where, block in BASH for words in _commands(block)
                   if words[0] == "rlcode" and words[1:2] and words[1] in ("fit", "validate", "test")]
MAKE_COMMANDS = [(where, words) for where, block in BASH for words in _commands(block) if words[0] == "make"]


def test_the_docs_have_snippets_of_each_kind():
    assert len(BASH) >= 10 and YAML and len(RLCODE_COMMANDS) >= 10 and MAKE_COMMANDS


@pytest.mark.parametrize(("where", "block"), BASH, ids=[where for where, _ in BASH])
def test_bash_snippet_is_valid_shell(where, block):
    result = subprocess.run(["bash", "-n"], input=block, text=True, capture_output=True)
    assert result.returncode == 0, f"{where}: {result.stderr}"


def test_every_make_target_in_the_docs_exists():
    targets = set(re.findall(r"^([\w-]+)\s*:(?!=)", (REPO / "Makefile").read_text(), re.M))
    for where, words in MAKE_COMMANDS:
        named = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        assert named and set(named) <= targets, f"{where}: {' '.join(words)}"


@pytest.mark.parametrize(("where", "block"), YAML, ids=[where for where, _ in YAML])
def test_yaml_snippet_loads(where, block):
    assert isinstance(yaml.safe_load(block), dict), where


def _parse(capsys, args: list[str]) -> dict:
    from rlcode.cli.command import main

    with pytest.raises(SystemExit) as stop:
        main([*args, "--print_config"])
    out = capsys.readouterr().out
    assert stop.value.code in (0, None), stop.value.code
    return yaml.safe_load(out)


@pytest.mark.slow
@pytest.mark.parametrize(("where", "block"), YAML, ids=[where for where, _ in YAML])
def test_yaml_config_fragment_parses_on_the_quickstart(where, block, tmp_path, capsys, monkeypatch):
    config = yaml.safe_load(block)
    if not set(config) <= CONFIG_SECTIONS:
        pytest.skip("not an rlcode config fragment")
    monkeypatch.chdir(REPO)
    fragment = tmp_path / "fragment.yaml"
    fragment.write_text(block)
    merged = _parse(capsys, ["fit", "--config", "configs/quickstart.yaml", "--config", str(fragment)])
    assert merged["model"]["model_name"], where


@pytest.mark.slow  # each parse builds the CLI (about a second)
@pytest.mark.parametrize(("where", "words"), RLCODE_COMMANDS,
                         ids=[f"{where}:{' '.join(words[1:4])}" for where, words in RLCODE_COMMANDS])
def test_rlcode_command_in_the_docs_parses(where, words, capsys, monkeypatch, tmp_path):
    """A config file of the reader's own (``--config my.yaml``) stands for any overlay: here a small one."""
    monkeypatch.chdir(REPO)
    args = list(words[1:])
    for i, word in enumerate(args[:-1]):
        if word in ("--config", "-c") and not (REPO / args[i + 1]).exists():
            own = tmp_path / Path(args[i + 1]).name
            own.write_text("run: {experiment: docs}\n")
            args[i + 1] = str(own)
    merged = _parse(capsys, args)
    assert "model" in merged, where
