"""Overlays cannot be mistaken for recipes: each says so in its first line, naming what it goes after,
and a command whose configs are all overlays is refused in one line."""

from __future__ import annotations

import pytest

from rlcode.cli import command as cli
from rlcode.cli.overlays import OVERLAY_MARK, config_files, overlay_bases, overlay_note

from config_stacks import CONFIGS, REPO, config_id

OVERLAYS = [config for config in CONFIGS if overlay_note(config) is not None]


def test_the_overlays_are_marked():
    names = {config.relative_to(REPO).as_posix() for config in OVERLAYS}
    assert {"configs/tiny_test.yaml", "configs/tiny_grpo.yaml", "configs/hw/v100.yaml",
            "benchmarks/configs/learn_mbpp_cpu_wide_long.yaml"} <= names
    assert "configs/quickstart.yaml" not in names and "benchmarks/configs/learn_mbpp_cpu.yaml" not in names


def test_the_studies_live_beside_their_benchmark():
    assert not list((REPO / "configs").glob("learn_mbpp_cpu*"))


@pytest.mark.parametrize("overlay", OVERLAYS, ids=config_id)
def test_an_overlay_names_existing_bases_that_start_with_a_recipe(overlay):
    bases = overlay_bases(overlay)
    assert bases and all((REPO / base).is_file() for base in bases), bases
    assert overlay_note(REPO / bases[0]) is None, "the first base is a recipe"


@pytest.mark.parametrize("configs", [["configs/tiny_grpo.yaml"], ["configs/tiny_test.yaml", "configs/tiny_grpo.yaml"],
                                     ["configs/hw/v100.yaml"]])
def test_overlays_alone_are_refused_in_one_line(configs, capsys, tmp_path):
    args = ["fit", *(word for name in configs for word in ("--config", str(REPO / name))),
            "--run.root_dir", str(tmp_path)]
    with pytest.raises(SystemExit) as refused:
        cli.main(args)
    message = str(refused.value.code)
    assert message.startswith(f"rlcode: {REPO / configs[0]} is an overlay, not a recipe: it goes after ")
    assert "\n" not in message and not list(tmp_path.iterdir())


def test_an_overlay_after_a_recipe_is_fine(capsys):
    with pytest.raises(SystemExit) as printed:
        cli.main(["fit", "--config", str(REPO / "configs/quickstart.yaml"),
                  f"--config={REPO / 'configs/tiny_test.yaml'}", "--print_config"])
    assert printed.value.code in (0, None)


def test_config_files_reads_both_spellings():
    assert config_files(["fit", "--config", "a.yaml", "--config=b.yaml", "--model.x", "1"]) == ["a.yaml", "b.yaml"]
    assert OVERLAY_MARK.startswith("# ")
