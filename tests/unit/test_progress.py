"""Long work shows its phase and the time it has taken while it runs (#30): a converge through
the API tells each operation as it starts (a real pyinfra run, on this machine's @local
connector), and the status line shows the phase, the operation and the clock, on a terminal
only."""

import io
import sys
import time

from rich.console import Console

from servefleet.cli import progress
from servefleet.verbs.session import converge


def test_a_converge_tells_each_operation_as_it_starts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local.py").write_text('hosts = ["@local"]\n')
    (tmp_path / "deploy.py").write_text(
        "from pyinfra.operations import server\n"
        'server.shell(name="First step", commands=["true"])\n'
        'server.shell(name="Second step", commands=["true"])\n'
    )
    heard: list[str] = []
    outcomes = converge("local.py", "deploy.py", on_operation=heard.append)
    assert outcomes["@local"].ok, outcomes
    assert heard == ["operation 1 of 2: First step", "operation 2 of 2: Second step"]


def test_the_status_line_shows_the_phase_the_operation_and_the_time():
    line = progress.Line("converging deploys/serve_q4_llamacpp.py")
    line.detail("operation 14 of 41: Build llama.cpp")
    line.started -= 125
    assert str(line) == (
        "converging deploys/serve_q4_llamacpp.py: operation 14 of 41: Build llama.cpp (2m 05s)"
    )
    line.phase("checking drift")  # a new phase: no detail, the clock from zero
    assert str(line) == "checking drift (0s)"
    assert [progress.elapsed(s) for s in (0, 59, 60, 3599, 3600)] == [
        "0s",
        "59s",
        "1m 00s",
        "59m 59s",
        "1h 00m",
    ]


def test_the_line_is_drawn_on_a_terminal_and_the_clock_runs():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with progress.status(console, "building the base image") as line:
        line.started -= 7
        time.sleep(0.3)  # rich redraws the line ~12 times a second
    assert "building the base image (7s)" in out.getvalue()


def test_nothing_is_drawn_off_a_terminal_nor_under_json():
    for console in (
        Console(file=io.StringIO(), force_terminal=False),
        progress.stderr_console(quiet=True),
    ):
        with progress.status(console, "converging"):
            time.sleep(0.2)
        if isinstance(console.file, io.StringIO):
            assert console.file.getvalue() == ""
    assert progress.stderr_console(quiet=True).quiet


def test_what_is_printed_under_a_quiet_status_line_is_not_lost(capsys):
    # A quiet console (--json) on a terminal: rich's live display would take sys.stderr over
    # and print it through the quiet console, i.e. nowhere.
    console = Console(stderr=True, force_terminal=True, quiet=True)
    with progress.status(console, "tearing down"):
        print("servefleet rebuild: teardown done", file=sys.stderr)
    assert capsys.readouterr().err == "servefleet rebuild: teardown done\n"
