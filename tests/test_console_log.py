"""The run directory keeps the run's console output (``console.log``): from the command's first line,
appended on resume; a command that never started a run leaves none behind."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from rlcode.cli.command import main
from rlcode.run_dir.console_log import ConsoleLog

REPO = Path(__file__).resolve().parents[1]
TINY = ["--config", str(REPO / "configs/quickstart.yaml"), "--config", str(REPO / "configs/tiny_test.yaml"),
        "--eval.at_start", "false", "--eval.at_end", "false"]


def test_what_is_printed_before_the_folder_is_known_is_kept_and_the_streams_come_back(tmp_path):
    before_out, before_err = sys.stdout, sys.stderr
    handler = logging.StreamHandler(sys.stderr)
    logging.getLogger("rlcode.test_console").addHandler(handler)
    try:
        console = ConsoleLog().start()
        print("first line")
        logging.getLogger("rlcode.test_console").warning("a library's record")
        console.attach(tmp_path / "run")
        print("second line", file=sys.stderr)
        console.stop()
        print("after the run")
    finally:
        logging.getLogger("rlcode.test_console").removeHandler(handler)
    assert (sys.stdout, sys.stderr) == (before_out, before_err) and handler.stream is before_err
    assert (tmp_path / "run/console.log").read_text() == "first line\na library's record\nsecond line\n"


def test_a_run_keeps_its_console_output_and_a_resume_appends_to_it(tmp_path, capsys):
    main(["fit", *TINY, "--run.root_dir", str(tmp_path), "--trainer.max_steps", "1"])
    printed = capsys.readouterr()
    log = tmp_path / "tiny/version_0/console.log"
    first = log.read_text()
    shown = printed.out + printed.err
    assert first and sorted(first.splitlines()) == sorted(shown.splitlines())  # the two streams interleave
    main(["fit", *TINY, "--run.root_dir", str(tmp_path), "--trainer.max_steps", "2", "--ckpt_path", "last"])
    second = capsys.readouterr()
    assert log.read_text().startswith(first) and len(log.read_text()) > len(first)
    assert sorted(log.read_text()[len(first):].splitlines()) == sorted((second.out + second.err).splitlines())
    assert not (tmp_path / "tiny/version_1").exists()


def test_a_command_that_fails_before_its_run_starts_leaves_no_run_directory(tmp_path):
    """The data is read once the trainer (and so the console log) is set up: the failure still leaves
    no ``version_0`` holding only what every command writes first."""
    with pytest.raises(SystemExit) as stop:
        main(["fit", *TINY, "--run.root_dir", str(tmp_path / "runs"), "--trainer.max_steps", "1",
              "--data.source", str(tmp_path / "missing.jsonl")])
    assert "missing.jsonl" in str(stop.value.code)
    assert not (tmp_path / "runs/tiny/version_0").exists()
