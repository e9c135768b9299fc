"""Every operator command explains itself at 80 columns: what it does and how it exits."""

import pytest

from servefleet.cli import COMMANDS, FLEET_VERBS, build_parser


@pytest.fixture
def parser(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal's width
    return build_parser()


def test_top_level_help_names_pyinfra_the_repository_root_and_the_exit_codes(parser):
    text = parser.format_help()
    assert "pyinfra inventory/<role>.py deploys/<recipe>.py" in text
    assert "repository root" in text and "exit codes:" in text
    assert "test tooling: demo, hub, testbed" in text
    assert max(len(line) for line in text.splitlines()) <= 80, text


def command_parser(parser, name: str):
    return next(a for a in parser._actions if a.dest == "command").choices[name]


@pytest.mark.parametrize("command", FLEET_VERBS)
def test_each_fleet_verb_says_what_it_does_and_how_it_exits(parser, command):
    sub = command_parser(parser, command)
    text = sub.format_help()
    assert sub.description and " ".join(sub.description.split()) in " ".join(text.split())
    assert "exit codes:" in text and "  3   a host could not be reached" in text
    assert max(len(line) for line in text.splitlines()) <= 80, text


@pytest.mark.parametrize("command", [c.replace("_", "-") for c in COMMANDS])
def test_every_command_has_a_description(parser, command):
    assert command_parser(parser, command).description
