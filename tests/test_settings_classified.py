"""Every setting says its range and its resume rule in one place, its annotation (``rlcode.setting``),
and everything that reads those (the range check, the resume guard, the help, the update's
settings) reads them from there."""

import dataclasses
import typing

import pytest

from rlcode.cli.help import MODE_CLASSES, SETTINGS
from rlcode.cli.resume_guard import FIXED, differences
from rlcode.cli.sections import SECTIONS
from rlcode.setting import (COUNT, Range, Setting, check_arguments, fixed_names, nested_settings_class, settings_by_key,
                            settings_of)
from rlcode.training.learner import Learner
from rlcode.training.policy_update import UpdateSettings

CLASSES = [(section, cls) for section, classes in SECTIONS.items() for cls in classes]


def _numeric(bare) -> bool:
    kinds = {bare, *typing.get_args(bare)}
    return bool(kinds & {int, float}) and bool not in kinds


def _settings_objects():
    """Each settings dataclass a section's class holds (``model.lora``, ``model.mode.sandbox``, ...)."""
    found = {}
    pending = [cls for _, cls in CLASSES]
    while pending:
        for _, bare in settings_of(pending.pop()).values():
            nested = nested_settings_class(bare)
            if nested is not None and nested not in found:
                found[nested.__name__] = nested
                pending.append(nested)
    return found


@pytest.mark.parametrize("section, cls", CLASSES, ids=[cls.__name__ for _, cls in CLASSES])
def test_every_setting_of_every_section_class_says_its_range_and_resume_rule(section, cls):
    for name, (setting, bare) in settings_of(cls).items():
        assert isinstance(setting, Setting), f"{section}.{name} of {cls.__name__} has no Setting annotation"
        assert setting.on_resume in ("fixed", "free"), f"{section}.{name}: a section's setting decides its rule"
        if _numeric(bare):
            assert setting.range is not None, f"{section}.{name} is a number without a range"


@pytest.mark.parametrize("name", sorted(_settings_objects()))
def test_every_number_of_a_settings_object_has_a_range(name):
    cls = _settings_objects()[name]
    for field in dataclasses.fields(cls):
        setting, bare = settings_of(cls)[field.name]
        if _numeric(bare):
            assert setting is not None and setting.range is not None, f"{name}.{field.name} has no range"
        if setting is not None:
            assert setting.on_resume == "as its holder", f"{name}.{field.name}: its holder decides its rule"


def test_the_modes_agree_on_the_settings_they_share():
    """``model.mode.num_generations`` means one thing whichever mode has it (the help shows one line)."""
    seen: dict[str, Setting] = {}
    for mode in SECTIONS["model.mode"]:
        for key, setting in settings_by_key(mode, "model.mode").items():
            assert seen.setdefault(key, setting) == setting, key


def test_the_help_names_the_modes_the_sections_hold():
    assert [path.rsplit(".", 1)[1] for path in MODE_CLASSES] == [mode.__name__ for mode in SECTIONS["model.mode"]]


def test_the_update_takes_the_learners_settings_by_name():
    learner = settings_of(Learner)
    own = {"importance_sampling_cap"}  # the sampler's, not a setting
    for field in dataclasses.fields(UpdateSettings):
        assert field.name in learner or field.name in own, field.name


def _saved_and_changed(cls, name):
    """Checkpoint hyper-parameters and a config differing only in ``name`` of ``cls`` (Learner or a mode)."""
    mode_path = f"rlcode.modes.{SECTIONS['model.mode'][0].__name__ if cls is Learner else cls.__name__}"
    saved = {"mode": {"class_path": mode_path, "init_args": {"other": 1}}, "model_name": "m"}
    changed = {"mode": {"class_path": mode_path, "init_args": {"other": 1}}, "model_name": "m"}
    holder_saved, holder_changed = (saved, changed) if cls is Learner else (saved["mode"]["init_args"],
                                                                               changed["mode"]["init_args"])
    holder_saved[name], holder_changed[name] = "before", "after"
    return saved, changed


@pytest.mark.parametrize("cls", [Learner, *SECTIONS["model.mode"]], ids=lambda cls: cls.__name__)
def test_a_resume_that_changes_a_fixed_setting_is_refused_and_a_free_one_is_not(cls):
    prefix = "model." if cls is Learner else "model.mode."
    for name, (setting, _) in settings_of(cls).items():
        if name == "mode":  # the mode's own settings are this test's other cases
            continue
        saved, changed = _saved_and_changed(cls, name)
        found = differences(saved, changed)
        if setting.on_resume == "fixed":
            assert found == [f"{prefix}{name} 'after' (checkpoint: 'before')"], name
        else:
            assert found == [], name


def test_a_setting_no_one_anticipated_is_classified_before_it_can_be_resumed():
    """The gap this design closes: ``rollout_precision`` was in neither list; now every setting is."""
    assert "rollout_precision" in settings_of(Learner) and "rollout_precision" not in FIXED
    assert "learning_rate" in FIXED and set(FIXED) == set(fixed_names(Learner)) - {"mode"}


def test_the_help_carries_each_settings_range_and_rule():
    assert SETTINGS["model.temperature"] == Setting(Range(0, low_open=True), "fixed")
    assert SETTINGS["model.lora.r"] == Setting(COUNT, "fixed")  # a field: its holder's rule
    assert SETTINGS["model.vllm.max_num_seqs"] == Setting(COUNT, "free")


def test_a_constructor_refuses_what_the_cli_refuses():
    with pytest.raises(ValueError, match=r"model\.num_iterations=0 is out of range: use an integer >= 1"):
        check_arguments(Learner, {"num_iterations": 0}, prefix="model.")
    with pytest.raises(ValueError, match=r"model\.mode\.num_generations=0 is out of range"):
        SECTIONS["model.mode"][0](num_generations=0)
    check_arguments(Learner, {"micro_batch_tokens": None, "top_k": 0}, prefix="model.")  # None: off
