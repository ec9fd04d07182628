"""stfast's one-line flag errors (issue 61): a flag's value of the wrong type, and a switch given both ways."""
import subprocess
import sys

import pytest

from stfast.cli import build_parser


def _err(capsys, argv):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_a_value_of_the_wrong_type_is_one_line_naming_the_flag(capsys):
    err = _err(capsys, ["train", "--epochs", "many"])
    assert err == "stfast: error: argument --epochs: invalid int value: 'many'\n"


def test_compile_and_no_compile_together_are_refused(capsys):
    for argv in (["train", "--compile", "--no-compile"], ["train", "--no-compile", "--compile"]):
        err = _err(capsys, argv)
        assert err.startswith("stfast: error: argument --") and "not allowed with argument" in err
        assert err.count("\n") == 1 and "--compile" in err and "--no-compile" in err


def test_the_command_line_says_it_once():
    r = subprocess.run([sys.executable, "-m", "stfast.cli", "train", "--epochs", "x"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and r.stderr == "stfast: error: argument --epochs: invalid int value: 'x'\n"
