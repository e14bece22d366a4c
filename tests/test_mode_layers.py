"""The modes sit one layer above the training step: ``rlcode.training`` never imports ``rlcode.modes``
(the CLI hands the Learner its mode), ``rlcode.algorithms`` (RL maths) imports neither, no mode
reaches up into the callbacks or the CLI, and ``rlcode.models`` imports none of the layers built on
it. Read from the source (every import, type-checking ones included), so an import hidden inside a
function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "rlcode"
ABOVE = {
    "algorithms": ("rlcode.training", "rlcode.modes", "rlcode.callbacks", "rlcode.cli", "rlcode.envs", "rlcode.data"),
    "training": ("rlcode.modes", "rlcode.callbacks", "rlcode.cli"),
    "modes": ("rlcode.callbacks", "rlcode.cli"),
    # loading, adapters, sharding and plain weights: what rollouts, training and the CLI build on
    "models": ("rlcode.rollout", "rlcode.training", "rlcode.modes", "rlcode.callbacks", "rlcode.cli"),
    # rewards (hidden tests' generator and cache included) sit on the sandbox alone: the data layer
    # hands them their columns
    "rewards": ("rlcode.data", "rlcode.rollout", "rlcode.logprobs", "rlcode.envs", "rlcode.eval",
                "rlcode.training", "rlcode.modes", "rlcode.callbacks", "rlcode.cli"),
}


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize("layer", sorted(ABOVE))
def test_no_import_from_a_layer_above(layer):
    files = sorted((PACKAGE / layer).glob("*.py"))
    assert files, layer
    for path in files:
        upward = [name for name in imported(path) if name.startswith(ABOVE[layer])]
        assert not upward, f"{path.relative_to(PACKAGE.parent)} imports {upward}"


def test_the_mode_contract_is_one_documented_class():
    from rlcode.modes import GRPO, SPIRAL, CodeGame, MultiStepMBPP
    from rlcode.training.mode import Mode

    abstract = Mode.__abstractmethods__
    assert abstract == {"collect", "validation_step", "test_step", "description"}
    for name in ("collect", "check_data", "configure", "setup", "teardown", "step_metrics", "validation_step",
                 "test_step", "description", "state_dict", "load_state_dict", "init_args", "config"):
        assert (getattr(Mode, name).__doc__ or "").strip(), f"Mode.{name} says what it is for"
    for mode in (GRPO, SPIRAL, MultiStepMBPP, CodeGame):
        assert issubclass(mode, Mode) and not mode.__abstractmethods__, mode.__name__
