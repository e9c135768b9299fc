"""Records root keeps in a node's state/ (releases.json, running.json, rollout.json, llama.cpp's
build records), planted by whoever got root's pen: each is parsed strictly and bounded
(servefleet/core/records.py, core/releases.py), and a record that is there but cannot be read
is reported in one line, never read as empty (an empty releases.json would be rewritten with
the new release alone), never a RecursionError, never a unit installed under a name outside
servefleet's, a prefix of `/` linked, or a gate that runs another program.

The facts' own parsers get the bytes a node would print (`process`, as pyinfra and the batch
call it); the reading command runs in a real shell here against a FIFO, a /dev/zero link and
an oversized file, under a deadline."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile

from servefleet.core import drift_items, records
from servefleet.core.layout import NodeLayout
from servefleet.core.releases import Releases
from servefleet.engines.llamacpp.logic import parse_builds
from servefleet.facts.releases import NodeReleases, RolloutMarkerFact, RunningRelease
from servefleet.verbs.healthgate import gate_problem
from tests.hostile.table import harmless, refused

CATEGORY = "node records"
ROOT = "/opt/servefleet"


def release(**changes) -> dict:
    doc = {
        "engine": "llama.cpp",
        "version": "b9785",
        "prefix": f"{ROOT}/llama.cpp/b9785",
        "unit": "servefleet-llama.service",
        "unit_text": "[Service]\nExecStart=/bin/true\n",
        "model_repo": "org/m",
        "model_revision": "main",
        "model_sha": "a" * 40,
        "model_dir": f"{ROOT}/models/org--m/" + "a" * 40,
        "data_digest": "d" * 16,
        "commit": "8be759e6f",
        "recorded_at": "2026-12-04T00:00:00Z",
        "perf": None,
        "probe_argv": ["/bin/true"],
        "gate": {
            "script": f"{ROOT}/bin/servefleet-health",
            "python": "python3",
            "url": "http://127.0.0.1:8080",
            "model": "m",
            "unit": "servefleet-llama.service",
            "key_file": None,
            "timeout_s": 600,
            "settle_s": 0,
            "expect_stopped": False,
        },
    }
    doc.update(changes)
    return doc


def releases_text(**changes) -> str:
    return json.dumps({"current": release(**changes), "previous": [], "rolled_back_from": None})


def node_lines(text: str | bytes) -> list[str]:
    """What records.read_command prints for a regular file of these bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return [base64.b64encode(raw).decode("ascii"), ""]


def unreadable_releases(text: str | bytes):
    def attempt():
        got = NodeReleases().process(node_lines(text))
        assert got.current is None and not got.previous, "a record was read from it"
        return got.unreadable

    return attempt


def unreadable(fact, text: str):
    def attempt():
        got = fact().process(node_lines(text))
        return str(got) if isinstance(got, records.Unreadable) else None

    return attempt


def deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


def shell_read(make) -> str:
    """What the facts' reading command prints for the path `make(dir)` returns, within 10 s."""
    with tempfile.TemporaryDirectory() as tmp:
        path = make(tmp)
        out = subprocess.run(
            ["sh", "-c", records.read_command(path)], capture_output=True, timeout=10
        ).stdout
        return out.decode("utf-8", "replace")


def fifo(tmp: str) -> str:
    path = os.path.join(tmp, "releases.json")
    os.mkfifo(path)
    return path


def zero_link(tmp: str) -> str:
    path = os.path.join(tmp, "releases.json")
    os.symlink("/dev/zero", path)
    return path


def oversized(tmp: str) -> str:
    path = os.path.join(tmp, "releases.json")
    with open(path, "w") as f:
        f.write(" " * (records.MAX_BYTES + 10) + "{}")
    return path


def via_shell(make):
    def attempt():
        return NodeReleases().process(shell_read(make).split("\n")).unreadable

    return attempt


def gate(**changes):
    def attempt():
        g = {**release()["gate"], **changes}
        return gate_problem(
            g,
            NodeLayout.of({"servefleet_root": ROOT}),
            {"python_interpreter": {"debian": "python3"}},
        )

    return attempt


def deep_build_record_is_no_build():
    builds = parse_builds([f"build b9785 {deep()}", "current /opt/servefleet/llama.cpp/b9785"])
    assert builds.records == {}, builds.records


def unreadable_records_are_drift():
    items = drift_items.release_items(Releases(unreadable="the release records: x"), None, True)
    assert items and all(i.state == "drifted" for i in items), items


def _cases():
    R, U = refused, unreadable
    return [
        R(
            CATEGORY,
            "releases.json nested 100,000 deep",
            "nested deeper than",
            unreadable_releases(
                json.dumps({"current": None, "previous": [], "x": 1})[:-1]
                + ', "y": '
                + deep()
                + "}"
            ),
        ),
        R(
            CATEGORY,
            "rollout.json nested 100,000 deep",
            "nested deeper than",
            U(RolloutMarkerFact, deep()),
        ),
        R(
            CATEGORY,
            "running.json nested 100,000 deep",
            "nested deeper than",
            U(RunningRelease, deep()),
        ),
        harmless(
            CATEGORY,
            "a build record nested 100,000 deep",
            "read as no build",
            deep_build_record_is_no_build,
        ),
        R(
            CATEGORY,
            "a marker whose extra is a list",
            "'extra' is not an object",
            U(
                RolloutMarkerFact,
                json.dumps(
                    {"rollout_id": "r", "target_digest": "", "phase": "gating", "extra": [1, 2]}
                ),
            ),
        ),
        R(
            CATEGORY,
            "a marker in no phase servefleet writes",
            "'phase' is not",
            U(
                RolloutMarkerFact,
                json.dumps({"rollout_id": "r", "target_digest": "", "phase": "done; rm -rf /"}),
            ),
        ),
        R(
            CATEGORY,
            "a release unit of ../../ (written to unit_dir/<unit>)",
            "not a servefleet unit name",
            unreadable_releases(releases_text(unit="../../x")),
        ),
        R(
            CATEGORY,
            "a release unit of another service",
            "not a servefleet unit name",
            unreadable_releases(releases_text(unit="ssh.service")),
        ),
        R(
            CATEGORY,
            "a release prefix of / (linked as current)",
            "absolute normalised path",
            unreadable_releases(releases_text(prefix="/")),
        ),
        R(
            CATEGORY,
            "a release prefix with ..",
            "absolute normalised path",
            unreadable_releases(releases_text(prefix=f"{ROOT}/llama.cpp/../../../")),
        ),
        R(
            CATEGORY,
            "a model_dir that is relative",
            "absolute normalised path",
            unreadable_releases(releases_text(model_dir="models/x")),
        ),
        R(
            CATEGORY,
            "an engine that is no engine's name",
            "'engine' is not an engine's name",
            unreadable_releases(releases_text(engine="sh -c id")),
        ),
        R(
            CATEGORY,
            "a gate with a key gate_args never writes",
            "unknown key",
            unreadable_releases(releases_text(gate={**release()["gate"], "exec": "/bin/sh"})),
        ),
        R(
            CATEGORY,
            "a gate whose timeout is true",
            "has the wrong type",
            unreadable_releases(releases_text(gate={**release()["gate"], "timeout_s": True})),
        ),
        R(
            CATEGORY,
            "a gate that runs another script as root",
            "names the script",
            gate(script="/tmp/x.py"),
        ),
        R(
            CATEGORY,
            "a gate that runs another interpreter as root",
            "names the interpreter",
            gate(python="/home/u/python3"),
        ),
        R(
            CATEGORY,
            "NaN in a release's figures",
            "NaN is not a number",
            unreadable_releases(releases_text().replace('"perf": null', '"perf": {"x": NaN}')),
        ),
        R(
            CATEGORY,
            "a key twice (which one wins?)",
            "a key appears twice",
            unreadable_releases(releases_text()[:-1] + ', "current": null}'),
        ),
        R(
            CATEGORY,
            "a model_sha that is not hex",
            "hex digits",
            unreadable_releases(releases_text(model_sha="zz")),
        ),
        R(
            CATEGORY,
            "a unit_text that is a number",
            "not a unit file's text",
            unreadable_releases(releases_text(unit_text=7)),
        ),
        R(
            CATEGORY,
            "200 previous releases",
            "at most 64",
            unreadable_releases(json.dumps({"current": None, "previous": [release()] * 200})),
        ),
        R(CATEGORY, "releases.json that is a list", "not an object", unreadable_releases("[]")),
        R(
            CATEGORY,
            "releases.json cut short",
            "is not JSON",
            unreadable_releases(releases_text()[:200]),
        ),
        R(
            CATEGORY,
            "running.json naming a path, not an id",
            "hex digits",
            U(RunningRelease, json.dumps({"release": "../../x"})),
        ),
        R(
            CATEGORY,
            "releases.json with bytes that are not UTF-8",
            "is not UTF-8 text",
            unreadable_releases(releases_text().encode().replace(b"org/m", b"org/\xff")),
        ),
        R(
            CATEGORY,
            "an answer cut short (not the base64 the node sends)",
            "not the base64",
            lambda: NodeReleases().process(["eyJjdXJyZW50Ijog", "#", ""]).unreadable,
        ),
        R(
            CATEGORY,
            "releases.json is a FIFO (cat would block)",
            "not a regular file",
            via_shell(fifo),
        ),
        R(
            CATEGORY,
            "releases.json links /dev/zero (cat would stream forever)",
            "not a regular file",
            via_shell(zero_link),
        ),
        R(CATEGORY, "releases.json larger than any record", "larger than", via_shell(oversized)),
        harmless(
            CATEGORY,
            "unreadable records in drift",
            "a drift item, not in sync",
            unreadable_records_are_drift,
        ),
    ]


def _round3():
    """More records as root's pen could plant them (#27 rule 6): each refused in one line,
    never read as a release."""
    R, G = refused, release()["gate"]
    bad = {
        "a unit name holding a newline": (
            releases_text(unit="servefleet-llama.service\n"),
            "not a servefleet unit name",
        ),
        "a unit name with a slash": (
            releases_text(unit="servefleet-a/b.service"),
            "not a servefleet unit name",
        ),
        "a prefix //etc (normpath keeps it; it is /etc)": (
            releases_text(prefix="//etc"),
            "absolute normalised path",
        ),
        "a prefix with a trailing slash": (
            releases_text(prefix=f"{ROOT}/llama.cpp/b9785/"),
            "absolute normalised path",
        ),
        "a model_dir with a NUL": (
            releases_text(model_dir=f"{ROOT}/models/x\u0000y"),
            "'model_dir' is not a line of text",
        ),
        "recorded_at an object": (releases_text(recorded_at={"a": 1}), "'recorded_at' is not"),
        "previous an object": (
            json.dumps({"current": release(), "previous": {"a": 1}}),
            "'previous' is not a list",
        ),
        "rolled_back_from a number": (
            json.dumps({"current": release(), "previous": [], "rolled_back_from": 5}),
            "the release rolled back from is not an object",
        ),
        "Infinity in the figures": (
            releases_text().replace('"perf": null', '"perf": {"x": Infinity}'),
            "Infinity is not a number a record holds",
        ),
        "1e999 in the figures (read as infinity)": (
            releases_text().replace('"perf": null', '"perf": {"decode": 1e999}'),
            "1e999 is out of range",
        ),
        "nested 17 levels (one more than records hold)": (
            releases_text().replace('"perf": null', '"perf": ' + "[" * 17 + "]" * 17),
            "nested deeper than 16 levels",
        ),
        "a byte order mark before the JSON": ("\ufeff" + releases_text(), "is not JSON"),
        "probe_argv a shell string": (
            releases_text(probe_argv="/bin/sh -c id"),
            "'probe_argv' is not a list of words",
        ),
        "a key servefleet never writes at the top": (
            json.dumps({"current": release(), "previous": [], "extra": 1}),
            "unknown key 'extra'",
        ),
        "a gate waiting -1 s": (
            releases_text(gate={**G, "timeout_s": -1}),
            "'timeout_s' is out of range",
        ),
        "a gate waiting 10^12 s as root": (
            releases_text(gate={**G, "settle_s": 10**12}),
            "'settle_s' is out of range",
        ),
    }
    return [
        R(CATEGORY, name, expected, unreadable_releases(text))
        for name, (text, expected) in bad.items()
    ] + [
        R(
            CATEGORY,
            "running.json with a key servefleet never writes",
            "unknown key 'x'",
            unreadable(RunningRelease, json.dumps({"release": "a" * 12, "x": 1})),
        ),
    ]


CASES = _cases() + _round3()
