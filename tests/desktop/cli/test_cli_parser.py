"""The command line builds only the chosen subcommand's arguments (issue 44, start-up): what
argparse prints and parses must be what the parser of every subcommand prints and parses,
for every subcommand's help, the top level's help and errors, and the parses the hot
commands see. `rbroker run` and `rbroker status` are read without argparse where their
command line is plain (`quick_args`): what they read, and every error argparse says for the
rest, must be the whole parser's."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rbroker.cli.main import QUICK, SUBCOMMANDS, build_parser, chosen_command, quick_args

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


def _outcome(parse: Callable[[list[str]], object], argv: list[str]) -> tuple[object, str, str]:
    """What `parse(argv)` gives: the namespace's items (each value's repr: NaN is NaN) or the
    exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parsed: object = sorted((k, repr(v)) for k, v in vars(parse(argv)).items())
        except SystemExit as exc:
            parsed = ("exit", exc.code)
    return parsed, out.getvalue(), err.getvalue()


def _whole(argv: list[str]) -> object:
    """`argv` read by the parser of every subcommand, as before issue 44."""
    return build_parser().parse_args(argv)


@pytest.mark.parametrize("argv", ARGVS, ids=" ".join)
def test_the_chosen_subcommands_parser_says_and_parses_what_the_whole_parser_does(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps to the terminal: one width for both
    whole = _outcome(_whole, argv)
    chosen = _outcome(lambda given: build_parser(chosen_command(given)).parse_args(given), argv)
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


# -- quick_args: `rbroker run` and `rbroker status` read without argparse ----------------------
QUICK_ARGVS: list[list[str]] = [
    ["status"],
    ["status", "--json"],
    ["status", "--json", "--json"],
    ["status", "--watch"],
    ["status", "--socket", "/b.sock", "--json"],
    ["status", "--socket=/b.sock"],
    ["status", "--socket", ""],
    ["status", "--socket="],
    ["status", "--json", "--watch"],
    ["status", "--json=1"],
    ["status", "extra"],
    ["status", "--js"],
    ["status", "-h"],
    ["status", "--socket"],
    ["run", "--mib", "100", "--", "/bin/true"],
    ["run", "--mib", "100"],
    ["run"],
    ["run", "--mib=100", "--wait", "5", "--", "python", "train.py", "--mib", "1"],
    ["run", "--mib", "1_000", "--gpus", " 2 ", "--", "x"],
    ["run", "--mib", "-5", "--", "x"],
    ["run", "--mib", "x", "--", "true"],
    ["run", "--mib", "1.5", "--", "true"],
    ["run", "--mi", "5", "--", "true"],
    ["run", "--wait", "nan", "--ttl", "inf", "--expected", "1e3", "--", "x"],
    ["run", "--cuda-devices", "index", "--", "x"],
    ["run", "--cuda-devices", "nope", "--", "x"],
    ["run", "--gpu", "GPU-a", "--gpus", "2", "--booking", "b-1", "--", "x"],
    ["run", "--project", "", "--session", "s", "--purpose", "p q", "x", "--", "y"],
    ["run", "--project=-x", "--", "y"],
    ["run", "--mib", "5", "--mib", "6", "--", "x"],
    ["run", "true", "--mib", "5"],
    ["run", "", "a"],
    ["run", "--mib", "5", "-", "x"],
    ["run", "--mib", "5", "-x"],
    ["run", "--socket", "", "--", "x"],
    ["run", "--mib"],
    ["run", "--help"],
    ["--version", "run"],
]


def _quick_or_whole(argv: list[str]) -> object:
    """What `rbroker.cli.main.main` reads `argv` with: `quick_args`, else argparse."""
    return quick_args(argv) or build_parser(chosen_command(argv)).parse_args(argv)


@pytest.mark.parametrize("argv", QUICK_ARGVS, ids=" ".join)
def test_quick_args_reads_what_argparse_reads_or_leaves_it_to_argparse(
    argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert _outcome(_quick_or_whole, argv) == _outcome(_whole, argv)


def test_quick_args_reads_the_plain_command_lines_itself() -> None:
    for argv in (
        ["status", "--json"],
        ["status", "--socket", "/b.sock", "--json"],
        ["run", "--mib", "100", "--", "/bin/true"],
        ["run", "--mib=100", "--wait", "5", "--cuda-devices", "uuid", "python", "t.py"],
    ):
        quick = quick_args(argv)
        assert quick is not None, argv
        assert vars(quick) == vars(build_parser().parse_args(argv))
    assert quick_args(["status", "--json", "--watch"]) is None  # argparse refuses it
    assert quick_args(["run", "--mib", "x"]) is None


WORDS = st.sampled_from(
    [
        *(o for _, (_, options) in QUICK.items() for o in options),
        "--",
        "-h",
        "--mi",
        "--mib=7",
        "--gpus=",
        "100",
        "-3",
        "2.5",
        "nan",
        "auto",
        "uuid",
        "",
        "/bin/true",
        "x y",
        "-",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(QUICK)), st.lists(WORDS, max_size=7))
def test_any_command_line_of_the_quick_subcommands_reads_as_argparse_reads_it(
    command: str, words: list[str]
) -> None:
    argv = [command, *words]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "100")
        assert _outcome(_quick_or_whole, argv) == _outcome(_whole, argv)
