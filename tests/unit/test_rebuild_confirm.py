"""`servefleet rebuild` asks before it wipes a node (#30): y or yes, in any case, proceeds;
anything else, or no answer, cancels (exit 1, nothing changed). The real command, in-process,
with the rebuild verb's plan and work replaced by recorders."""

import io
import json

import pytest

from servefleet.cli import main
from servefleet.core.errors import Exit
from servefleet.verbs import rebuild
from servefleet.verbs.session import HostOutcome

ARGS = ["rebuild", "inventory/spark.py", "deploys/base.py", "--limit", "spark-01"]


@pytest.fixture
def rebuilt(monkeypatch):
    """The hosts rebuild.rebuild was called for (empty: cancelled before anything changed)."""
    calls: list[list[str]] = []
    monkeypatch.setattr(
        rebuild, "plan", lambda *a, **kw: rebuild.RebuildResult(["spark-01"], Exit.OK)
    )

    def work(inventory, deploy, names, purge, data=None, say=None, on_operation=None):
        calls.append(names)
        if on_operation:
            on_operation("operation 1 of 1: Stop the service")
        done = {n: HostOutcome(n, True, 1, 1) for n in names}
        return rebuild.RebuildResult(names, Exit.OK, teardown=done, converge=dict(done))

    monkeypatch.setattr(rebuild, "rebuild", work)
    return calls


def answer(monkeypatch, text: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(text))


@pytest.mark.parametrize("text", ["y\n", "Y\n", "yes\n", "YES\n", " Yes \n"])
def test_y_and_yes_in_any_case_proceed(monkeypatch, capsys, rebuilt, text):
    answer(monkeypatch, text)
    assert main(ARGS) == 0  # was: "y" cancelled, exit 1
    assert rebuilt == [["spark-01"]]
    err = capsys.readouterr().err
    assert "[y/N]" in err and "cancelled" not in err


@pytest.mark.parametrize("text", ["n\n", "no\n", "\n", "", "yess\n", "sure\n"])
def test_anything_else_cancels_and_changes_nothing(monkeypatch, capsys, rebuilt, text):
    answer(monkeypatch, text)
    assert main(ARGS) == 1
    assert rebuilt == []
    assert "servefleet rebuild: cancelled; nothing was changed" in capsys.readouterr().err


def test_a_cancelled_rebuild_under_json_is_one_json_object(monkeypatch, capsys, rebuilt):
    answer(monkeypatch, "n\n")
    assert main([*ARGS, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == 1 and doc["error"] == "cancelled; nothing was changed"
    assert doc["hosts"]["spark-01"] == {"teardown": None, "converge": None, "ok": False}


def test_a_rebuild_under_json_reports_each_host(monkeypatch, capsys, rebuilt):
    assert main([*ARGS, "--yes", "--json"]) == 0
    out = capsys.readouterr()
    doc = json.loads(out.out)
    assert doc["summary"] == {"hosts": 1, "rebuilt": 1, "not_rebuilt": 0}
    assert doc["hosts"]["spark-01"]["converge"]["ok"] and doc["error"] is None
    assert "operation 1 of 1" not in out.err  # no status line under --json (nor off a terminal)
