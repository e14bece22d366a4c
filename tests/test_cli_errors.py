"""A mistake reaches the user as at most three lines on stderr: what is wrong, where (the key, the
config file and line, or the command line) and the fix, with "did you mean" for misspellings; no
usage dump, no traceback. ``--debug`` / ``RLCODE_DEBUG=1`` keep the full traceback."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlcode.cli import errors as cli_errors
from rlcode.cli.command import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"), "--config", str(REPO / "configs/tiny_grpo.yaml")]

YAML_FILES = {  # name -> text of a config with one mistake
    "typo.yaml": "model:\n  temperature: 1.0\n  learnig_rate: 1e-5\n",
    "top.yaml": "run:\n  experiment: x\nevall:\n  num_questions: 3\n",
    "badtype.yaml": "model:\n  mode:\n    init_args:\n      num_generations: two\n",
    "syntax.yaml": "model:\n  temperature: [1.0\n  top_p: 1\n",
}
# name -> (arguments after `rlcode`, strings the report must contain); {tmp} is the test's folder
CASES = {
    "key_typo_on_the_command_line": (
        ["fit", *TINY, "--model.learnig_rate", "1e-5"],
        ["--model.learnig_rate is not a setting", "on the command line", "did you mean --model.learning_rate?"]),
    "key_typo_in_yaml": (
        ["fit", *TINY, "--config", "{tmp}/typo.yaml"],
        ["model.learnig_rate", "{tmp}/typo.yaml, line 3", "did you mean model.learning_rate?"]),
    "section_typo_in_yaml": (
        ["fit", *TINY, "--config", "{tmp}/top.yaml"],
        ["evall.num_questions is not a setting", "{tmp}/top.yaml, line 4", "did you mean eval.num_questions?"]),
    "abbreviated_key": (  # argparse expanded it (while the same key in YAML was refused)
        ["fit", *TINY, "--model.temp", "0.5"],
        ["--model.temp is not a setting", "did you mean --model.temperature?"]),
    "trainer_key_typo": (
        ["fit", *TINY, "--trainer.max_stepz", "3"],
        ["--trainer.max_stepz", "did you mean --trainer.max_steps?"]),
    "nested_key_typo": (
        ["fit", *TINY, "--model.lora", "{rr: 4}"],
        ["model.lora.rr is not a setting of LoraSettings", "did you mean model.lora.r?"]),
    "data_key_typo": (
        ["fit", *TINY, "--data.prompts_per_stp", "3"],
        ["data.prompts_per_stp is not a setting of MBPPDataModule", "did you mean data.prompts_per_step?"]),
    "settings_without_a_space_after_the_colon": (
        ["fit", *TINY, "--model.lora", "{r:4}"],
        ["model.lora cannot be '{r:4}'", "a space after each colon", "--model.lora.NAME VALUE"]),
    "wrong_type": (
        ["fit", *TINY, "--model.mode.num_generations", "two"],
        ["model.mode.num_generations cannot be 'two'", "on the command line", "an integer"]),
    "wrong_type_in_yaml": (
        ["fit", *TINY, "--config", "{tmp}/badtype.yaml"],
        ["model.mode.num_generations cannot be 'two'", "{tmp}/badtype.yaml, line 4"]),
    "missing_config_file": (
        ["fit", "--config", "configs/quickstrat.yaml"],
        ["config file configs/quickstrat.yaml does not exist", "did you mean configs/quickstart.yaml?"]),
    "yaml_syntax_error": (
        ["fit", *TINY, "--config", "{tmp}/syntax.yaml"],
        ["{tmp}/syntax.yaml is not valid YAML", "line 3, column 8"]),
    "unknown_model_class": (
        ["fit", *TINY, "--model.mode", "rlcode.modes.SPIRALL"],
        ["unknown model.mode class 'rlcode.modes.SPIRALL'", "did you mean rlcode.modes.SPIRAL?",
         "rlcode.modes.CodeGame"]),
    "unknown_class_in_help": (
        ["fit", "--model.mode.help", "SPIRALL"],
        ["unknown model.mode class 'SPIRALL' (in --model.mode.help)", "did you mean SPIRAL?"]),
    "unknown_data_class": (
        ["fit", *TINY, "--data", "GameDataModul"],
        ["unknown data class 'GameDataModul'", "did you mean GameDataModule?"]),
    "bad_prompt_format": (
        ["fit", *TINY, "--data.prompt_format", "chatt"],
        ["data.prompt_format cannot be 'chatt'", "did you mean chat?", "'chat' or 'plain'"]),
    "one_generation": (
        ["fit", *TINY, "--model.mode.num_generations", "1"],
        ["num_generations=1 gives every group a zero std", "use num_generations >= 2", "on the command line"]),
    "quantization_without_lora": (
        ["fit", *TINY, "--model.quantization", "4bit"],
        ["model.quantization='4bit' needs model.lora", "--model.lora '{r: 16}'"]),
    "missing_checkpoint": (
        ["fit", *TINY, "--run.root_dir", "{tmp}/runs", "--ckpt_path", "{tmp}/nowhere.ckpt"],
        ["--ckpt_path {tmp}/nowhere.ckpt: no such file", "--ckpt_path last"]),
    "unknown_model": (
        ["fit", *TINY, "--run.root_dir", "{tmp}/runs", "--model.model_name", "smollm2-135m-instruktion"],
        ["model.model_name 'smollm2-135m-instruktion'", "did you mean smollm2-135m-instruct?"]),
    "unknown_reward": (
        ["fit", *TINY, "--run.root_dir", "{tmp}/runs", "--model.mode.rewards", "[executoin]"],
        ["unknown reward 'executoin' in model.mode.init_args.rewards", "did you mean 'execution'?"]),
    "unknown_command": (["fitt", *TINY], ["unknown command 'fitt'", "did you mean fit?"]),
    "deepspeed_strategy": (  # what TRL and accelerate users try first: refused before any run folder exists
        ["fit", *TINY, "--run.root_dir", "{tmp}/deepspeed_runs", "--trainer.strategy", "deepspeed"],
        ["--trainer.strategy deepspeed: rlcode runs two strategies", "--trainer.strategy ddp or --trainer.strategy fsdp"]),
    "fsdp1_strategy": (
        ["fit", *TINY, "--run.root_dir", "{tmp}/deepspeed_runs", "--trainer.strategy", "fsdp_cpu_offload"],
        ["--trainer.strategy fsdp_cpu_offload: rlcode runs two strategies"]),
    "predict_is_gone": (["predict", *TINY], ["unknown command 'predict'", "fit, validate, test, export"]),
}

# Runs every case in one interpreter (one import of torch and Lightning instead of one per case), each
# with file descriptor 2 sent to its own file: what Lightning's and the libraries' loggers write lands
# there as it would on a terminal, and a SystemExit message is printed as the interpreter prints it.
_RUNNER = """
import json, os, sys
from rlcode.cli.command import main
cases, folder = json.loads(sys.argv[1]), sys.argv[2]
del sys.argv[1:]  # main(args) reads only its arguments
for name, args in cases.items():
    fd = os.open(os.path.join(folder, name + ".err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        main(args)
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(fd)
"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("cli_errors")
    for name, text in YAML_FILES.items():
        (tmp / name).write_text(text)
    cases = {name: [arg.replace("{tmp}", str(tmp)) for arg in args] for name, (args, _) in CASES.items()}
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.pop("RLCODE_DEBUG", None)
    subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(cases), str(tmp)], cwd=REPO, env=env, check=True,
                   timeout=300)
    reports = {name: (tmp / f"{name}.err").read_text().replace(str(tmp), "{tmp}") for name in CASES}
    reports["_folders"] = sorted(p.name for p in tmp.iterdir() if p.is_dir())
    return reports


@pytest.mark.slow
def test_a_refused_strategy_leaves_no_run_folder(reports):
    assert "deepspeed_runs" not in reports["_folders"], reports["_folders"]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_mistake_is_at_most_three_lines_naming_what_where_and_the_fix(reports, case):
    report = reports[case]
    lines = report.strip().splitlines()
    assert 1 <= len(lines) <= 3, report
    assert lines[0].startswith("rlcode: "), report
    for expected in CASES[case][1]:
        assert expected in report, (expected, report)
    assert "Traceback" not in report and "usage:" not in report


def test_valid_settings_still_parse(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, "--model.learning_rate", "1e-5", "--model.mode", "SPIRAL", "--data", "GameDataModule",
              "--print_config"])
    assert stop.value.code in (0, None)
    printed = capsys.readouterr().out
    assert "rlcode.modes.SPIRAL" in printed and "learning_rate: 1.0e-05" in printed


def test_debug_flag_keeps_the_traceback_and_the_parser_message():
    with pytest.raises(cli_errors.UserError) as raised:
        main(["fit", *TINY, "--model.learnig_rate", "1e-5", "--debug"])
    assert "unrecognized arguments: --model.learnig_rate" in str(raised.value.__cause__)  # jsonargparse's own message


def test_debug_environment_variable_keeps_the_traceback(monkeypatch, tmp_path):
    monkeypatch.setenv("RLCODE_DEBUG", "1")
    with pytest.raises(cli_errors.UserError, match="num_generations >= 2") as raised:
        main(["fit", *TINY, "--run.root_dir", str(tmp_path), "--model.mode.num_generations", "1"])
    assert isinstance(raised.value.__cause__, ValueError)
    assert cli_errors.take_debug_flag(["fit", "--debug"]) == (["fit"], True)
    monkeypatch.setenv("RLCODE_DEBUG", "0")
    assert cli_errors.take_debug_flag(["fit"]) == (["fit"], False)


def test_where_a_key_is_set(tmp_path):
    base, overlay = tmp_path / "base.yaml", tmp_path / "overlay.yaml"
    base.write_text("model:\n  init_args:\n    beta: 0.1\n")
    overlay.write_text("run:\n  experiment: x\nmodel:\n  beta: 0.2\n")
    argv = ["fit", "--config", str(base), "-c", str(overlay)]
    assert cli_errors.locate(["model", "beta"], argv) == f"{overlay}, line 4"  # the last file that sets it
    assert cli_errors.locate(["model", "beta"], argv[:3]) == f"{base}, line 3"  # under init_args
    assert cli_errors.locate(["model", "beta"], [*argv, "--model.beta=0.3"]) == "on the command line"
    assert cli_errors.did_you_mean("learnig_rate", ["learning_rate", "beta"]) == "did you mean learning_rate? "
    assert cli_errors.did_you_mean("zzz", ["learning_rate", "beta"]) == ""


def test_missing_dataset_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "nowhere" / "mbpp.jsonl"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *TINY, "--run.root_dir", str(tmp_path), "--data.source", str(missing)])
    message = str(exit_info.value.code)
    assert message.startswith("rlcode: ") and "\n" not in message
    assert str(missing) in message
