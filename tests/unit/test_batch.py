"""servefleet.facts.batch: facts read together in one shell command give the answers each
gives read on its own (pyinfra's get_fact rules: the parser on stdout, the default where the
command failed or printed nothing). Run here with the node's shell, on this machine's files."""

from __future__ import annotations

import shlex
import subprocess
import sys

from pyinfra.api import FactBase

from servefleet.core.batch import split_batch
from servefleet.facts import batch
from servefleet.facts.node import Account, CpuArch, DirEntries, InstalledDebs, OsRelease, PathStat
from servefleet.facts.pyenv import DistVersions


class Printf(FactBase):
    """Prints exactly `text` (no final newline unless it has one)."""

    default = list

    def command(self, text: str):
        return f"printf %s {shlex.quote(text)}"

    def process(self, output):
        return list(output)


class Fails(FactBase):
    default = dict

    def command(self, status: int):
        return f"echo printed-before-failing; exit {status}"

    def process(self, output):
        raise AssertionError("a failed command is not parsed")


def sh(command: str) -> tuple[bool, list[str]]:
    proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return proc.returncode == 0, proc.stdout.splitlines()


def alone(cls, kwargs: dict):
    """The fact read on its own, as pyinfra's get_fact does."""
    ok, lines = sh(batch.command_of(cls, kwargs))
    fact = cls()
    fact.command(**kwargs)
    return fact.process(lines) if ok and lines else fact.default()


def together(facts: list[tuple[type, dict]], nonce: str = "5f1e0c2a9b7d3e41"):
    keys = [batch._key(cls, kw) for cls, kw in facts]
    command = batch.Batch().command(nonce, tuple(batch.command_of(c, dict(kw)) for c, kw in keys))
    ok, lines = sh(command)
    assert ok
    return keys, batch.answers(keys, split_batch(lines, nonce))


def test_batched_answers_equal_one_by_one(tmp_path):
    venv = tmp_path / "venv"
    site = venv / f"lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages"
    meta = site / "uv-0.13.9.dist-info/METADATA"
    meta.parent.mkdir(parents=True)
    meta.write_text("Metadata-Version: 2.4\nName: uv\nVersion: 0.13.9\n\nVersion: 9.9 (body)\n")
    (tmp_path / "a file").write_text("x")
    facts = [
        (CpuArch, {}),
        (OsRelease, {}),
        (PathStat, {"path": str(tmp_path)}),
        (PathStat, {"path": str(tmp_path / "a file")}),
        (PathStat, {"path": str(tmp_path / "missing")}),
        (InstalledDebs, {"names": ("dpkg", "no-such-package-here")}),
        (Account, {"user": "root", "group": "root"}),
        (Account, {"user": "no-such-user-here", "group": "no-such-group-here"}),
        (DirEntries, {"path": str(tmp_path)}),
        (DirEntries, {"path": str(tmp_path / "missing")}),
        (DistVersions, {"venv": str(venv), "names": ("uv", "gguf")}),
        (Printf, {"text": "no final newline"}),
        (Printf, {"text": "two lines\nand one more\n"}),
        (Printf, {"text": ""}),
        (Fails, {"status": 3}),
    ]
    keys, got = together(facts)
    for (cls, kwargs), key in zip(facts, keys, strict=False):
        assert got[key] == alone(cls, kwargs), cls.__name__
    # The answers are real, not defaults all round.
    assert got[keys[2]]["type"] == "directory" and got[keys[3]]["type"] == "regular file"
    assert got[keys[4]] is None and "dpkg" in got[keys[5]]
    assert got[keys[6]]["user"]["uid"] == "0" and not got[keys[7]].get("user")
    assert got[keys[10]] == {"uv": "0.13.9"} and got[keys[11]] == ["no final newline"]
    assert got[keys[14]] == {}  # failed: the default, its output ignored


def test_a_printed_marker_of_another_nonce_splits_nothing():
    forged = "0000000000000000 1 0\nlate"
    keys, got = together([(Printf, {"text": forged}), (Printf, {"text": "second"})])
    assert got[keys[0]] == forged.splitlines() and got[keys[1]] == ["second"]


def test_a_fact_that_checks_for_its_command_reads_as_pyinfra_reads_it():
    class NeedsTool(FactBase):
        default = list

        def requires_command(self, tool):
            return tool

        def command(self, tool):
            return f"{tool} --version"

        def process(self, output):
            return list(output)

    keys, got = together(
        [
            (NeedsTool, {"tool": "no-such-tool-here"}),
            (NeedsTool, {"tool": "sh"}),
            (NeedsTool, {"tool": "dpkg"}),
        ]
    )
    assert got[keys[0]] == []  # missing: the default, not the marker
    assert got[keys[2]] and "dpkg" in got[keys[2]][0]


class _Host:  # a weakref-able stand-in for pyinfra's Host
    name = "spark-1"


class _Meta:
    def __init__(self, executed):
        self.executed = executed


class _OpData:
    def __init__(self, executed):
        self.operation_meta = _Meta(executed)


class _State:
    def __init__(self, host, ops):
        self.ops = {host: {h: _OpData(x) for h, x in ops.items()}}


def test_a_second_run_in_one_process_does_not_look_up_the_first_runs_operation(monkeypatch):
    """The demo, rebuild and rollout converge several deploys in one process: the host's last
    operation of an earlier run is not one of this run's (was: KeyError on the demo's second
    deploy, README's first command)."""
    forgotten = []
    monkeypatch.setattr(batch, "forget", lambda host: forgotten.append(host))
    host = _Host()
    first = _State(host, {"a": True})
    batch._ForgetAfterCommands.operation_host_start(first, host, "a")
    second = _State(host, {"b": False, "c": False})
    batch._ForgetAfterCommands.operation_host_start(second, host, "b")  # no KeyError
    assert forgotten == []
    batch._ForgetAfterCommands.operation_host_start(second, host, "c")  # b ran nothing
    assert forgotten == []
    third = _State(host, {"d": True, "e": False})
    batch._ForgetAfterCommands.operation_host_start(third, host, "d")
    batch._ForgetAfterCommands.operation_host_start(third, host, "e")  # d ran commands
    assert forgotten == [host]
