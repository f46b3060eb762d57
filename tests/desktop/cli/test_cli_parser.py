"""The command line builds only the chosen subcommand's arguments (issue 44, start-up): what
argparse prints and parses must be what the parser of every subcommand prints and parses,
for every subcommand's help, the top level's help and errors, and the parses the hot
commands see."""

from __future__ import annotations

import contextlib
import io

import pytest

from rbroker.cli.main import SUBCOMMANDS, build_parser, chosen_command

NAMES = [name for name, _, _ in SUBCOMMANDS]

ARGVS: list[list[str]] = [
    [],
    ["--help"],
    ["-h"],
    ["--version"],
    ["--vers"],
    ["nope"],
    ["-", "status"],
    ["--", "status", "--json"],
    ["--bogus", "status"],
    ["status", "--bogus"],
    ["status", "--json"],
    ["status", "--json", "--watch"],
    ["status", "--socket", ""],
    ["status", "--socket", "/x.sock", "--json"],
    ["run", "--mib", "100", "--", "/bin/true"],
    ["run", "--mib=100", "--wait", "5", "--", "python", "train.py", "--mib", "1"],
    ["run", "--mib", "x", "--", "true"],
    ["run", "--mi", "5", "--", "true"],
    ["run", "--cuda-devices", "nope", "--", "true"],
    ["run", "true", "--mib", "5"],
    ["book", "cancel"],
    ["book", "--mib", "5", "--start", "now", "--for", "1h", "--until", "2h"],
    ["broker", "--simulate"],
    ["broker", "--data-dir", "d", "--config", "c.toml"],
    ["demo", "--seconds", "3"],
    ["fleet", "--room", "0"],
    ["service", "bad"],
    ["service", "run", "--data-dir", "x"],
    ["top", "--once", "extra"],
    ["tray", "--show"],
    *([name, "--help"] for name in NAMES),
]


def _outcome(parser_of: object, argv: list[str]) -> tuple[object, str, str]:
    """What parsing `argv` gives: the namespace's items or the exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parsed: object = sorted(vars(parser_of(argv).parse_args(argv)).items())  # type: ignore[operator]
        except SystemExit as exc:
            parsed = ("exit", exc.code)
    return parsed, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", ARGVS, ids=" ".join)
def test_the_chosen_subcommands_parser_says_and_parses_what_the_whole_parser_does(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal: one width for both
    whole = _outcome(lambda _argv: build_parser(), argv)
    chosen = _outcome(lambda given: build_parser(chosen_command(given)), argv)
    assert chosen == whole


def test_the_chosen_command_is_the_first_word_that_is_no_option_and_names_a_subcommand() -> None:
    assert chosen_command(["run", "--mib", "1", "--", "status"]) == "run"
    assert chosen_command(["--", "status"]) == "status"
    assert chosen_command(["-h", "jobs"]) == "jobs"
    assert chosen_command(["--version"]) is None
    assert chosen_command(["stat"]) is None  # no abbreviations: argparse refuses it
    assert chosen_command([]) is None


def test_only_the_chosen_subcommand_gets_its_arguments() -> None:
    parser = build_parser("status")
    sub = next(a for a in parser._actions if a.dest == "command")
    assert isinstance(sub.choices, dict)
    filled = {name for name, p in sub.choices.items() if len(p._actions) > 1}
    assert filled == {"status"}  # the others hold their -h alone
    assert list(sub.choices) == NAMES
