"""A hostile engine's model directory: the models root is in the engine's ReadWritePaths, so it
can plant symlinks, FIFOs, extra files and a forged record there, and answer the health check
with anything. Root must neither follow, block on, nor trust any of it.

The fetcher (files/model/fetch_model.py) runs here on a directory that already holds the
expected file (no download needed); the node's facts (servefleet.facts.models) run their real
shell command here, as `nobody`; the eviction script runs as `nobody`. Each case checks that
nothing outside the directory was read, written or deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from servefleet.core.models import invalid_record_reason, parse_verified, split_record
from servefleet.facts.models import ModelFile, VerifiedModel, file_problem
from tests.hostile.table import harmless, refused

CATEGORY = "model directories"
REPO = Path(__file__).resolve().parents[2]
PAYLOAD = b"weights " * 512
USER = "nobody"


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FM = _load("fetch_model", "files/model/fetch_model.py")
HEALTH = _load("health", "files/health/health.py")


@contextlib.contextmanager
def model_dir():
    """(dest, outside): a model directory holding the expected `a.safetensors`, owned by the
    service user (`nobody` here), and a directory outside it with a file that must survive."""
    base = Path(tempfile.mkdtemp(prefix="servefleet-hostile-model-"))
    try:
        base.chmod(0o755)
        dest, outside = base / "models" / "m", base / "outside"
        dest.mkdir(parents=True), outside.mkdir()
        (dest / "a.safetensors").write_bytes(PAYLOAD)
        (outside / "a.safetensors").write_bytes(b"root's, not the engine's")
        (outside / "a.safetensors.metadata").write_bytes(b"root's")
        uid = pwd.getpwnam(USER).pw_uid
        for p in [base / "models", dest, dest / "a.safetensors"]:
            os.chown(p, uid, -1)
        yield dest, outside
    finally:
        shutil.rmtree(base)


def snapshot(directory: Path) -> dict:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def request(dest: Path) -> dict:
    return {
        "source": "hub",
        "repo_id": "org/m",
        "revision": "a" * 40,
        "sha": "a" * 40,
        "include": ["*"],
        "dest": str(dest),
        "root": str(dest.parent),
        "margin_bytes": 0,
        "files": [
            {
                "path": "a.safetensors",
                "size": len(PAYLOAD),
                "sha256": hashlib.sha256(PAYLOAD).hexdigest(),
            }
        ],
    }


def fetch_with(plant):
    """The fetcher on a directory where plant(dest, outside) put something: it verifies, records
    only the model's file, removes what was planted (never a link's target) and leaves
    everything outside alone."""

    def check():
        with model_dir() as (dest, outside):
            before = snapshot(outside)
            plant(dest, outside)
            doc = FM.run(request(dest))
            assert set(doc["files"]) == {"a.safetensors"}, doc["files"]
            assert snapshot(outside) == before, "something outside the model directory changed"
            left = sorted(
                str(p.relative_to(dest))
                for p in dest.rglob("*")
                if not p.is_dir() or p.is_symlink()
            )
            assert left == ["a.safetensors", ".servefleet/verified.json"] or set(left) <= {
                "a.safetensors",
                ".servefleet/verified.json",
                ".cache/huggingface/download/keep",
            }, left
            assert not any(p.is_symlink() for p in dest.rglob("*"))
            assert (dest / ".servefleet").is_dir() and not (dest / ".servefleet").is_symlink()

    return check


def run_fact(fact, **kwargs) -> list[str]:
    """A fact's real command, run here as root would run it on a node; its output lines."""
    done = subprocess.run(
        ["sh", "-c", fact().command(**kwargs)], capture_output=True, text=True, timeout=60
    )
    return done.stdout.splitlines()


def model_file(plant, max_bytes: int = 4096):
    """(problem, text) of ModelFile on dest/config.json after plant(dest)."""
    with model_dir() as (dest, _):
        plant(dest)
        lines = run_fact(ModelFile, path=str(dest / "config.json"), user=USER, max_bytes=max_bytes)
        return file_problem(ModelFile().process(lines), max_bytes)


def refused_read(name: str, plant, expected: str, max_bytes: int = 4096):
    def attempt():
        problem, text = model_file(plant, max_bytes)
        assert text is None, f"read {len(text)} characters: {text[:80]!r}"
        return problem

    return refused(CATEGORY, name, expected, attempt)


def forged_record_is_ignored():
    """A forged in-directory record with the right sizes: the fact reads root's record in
    state/ (absent here), so the model is not taken as verified."""
    with model_dir() as (dest, outside):
        (dest / ".servefleet").mkdir()
        forged = {
            "repo_id": "org/m",
            "sha": "a" * 40,
            "include": ["*"],
            "files": {"a.safetensors": len(PAYLOAD)},
            "sha256": {},
        }
        (dest / ".servefleet/verified.json").write_text(json.dumps(forged))
        lines = run_fact(
            VerifiedModel, path=str(dest), record=str(outside / "state.json"), user=USER
        )
        assert parse_verified(lines) is None


def unlisted_file_voids_the_record():
    with model_dir() as (dest, outside):
        record = {
            "repo_id": "org/m",
            "sha": "a" * 40,
            "include": ["*"],
            "files": {"a.safetensors": len(PAYLOAD)},
            "sha256": {},
        }
        (outside / "state.json").write_text(json.dumps(record))
        (dest / "modeling_evil.py").write_text("import os\n")
        lines = run_fact(
            VerifiedModel, path=str(dest), record=str(outside / "state.json"), user=USER
        )
        assert parse_verified(lines) is None
        assert "not part of the model: modeling_evil.py" in invalid_record_reason(
            *split_record(lines)
        )


def listing_follows_no_link():
    """A planted link to / in the directory is listed as an entry (unlisted: drift), not walked."""
    with model_dir() as (dest, outside):
        record = {
            "repo_id": "org/m",
            "sha": "a" * 40,
            "include": ["*"],
            "files": {"a.safetensors": len(PAYLOAD)},
            "sha256": {},
        }
        (outside / "state.json").write_text(json.dumps(record))
        (dest / "root").symlink_to("/")
        lines = run_fact(
            VerifiedModel, path=str(dest), record=str(outside / "state.json"), user=USER
        )
        _, on_disk = split_record(lines)
        assert set(on_disk) == {"a.safetensors", "root"}, sorted(on_disk)[:5]


def evict_follows_no_link():
    with model_dir() as (dest, outside):
        (dest / "etc").symlink_to("/etc")
        (dest / "loop").symlink_to(".")
        (dest / "outside.safetensors").symlink_to(outside / "a.safetensors")
        os.mkfifo(dest / "pipe")
        done = subprocess.run(
            [sys.executable, str(REPO / "files/pagecache/evict.py"), str(dest), "--user", USER],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert (report["files"], report["bytes"]) == (1, len(PAYLOAD)), report


def answer_refused(name: str, data: bytes, expected: str):
    def attempt():
        try:
            HEALTH.engine.loads(data, "chat completion")  # the reader health.py reads through
        except HEALTH.engine.EngineError as exc:
            return str(exc)
        return None

    return refused(CATEGORY, name, expected, attempt)


def endless_answer():
    """An answer that never ends, on a socket: the reader stops at its byte bound."""
    ours, engine = socket.socketpair()
    engine.sendall(b"[" * 65536)  # and the reader's own bound does the rest: more than fits
    reader = HEALTH.engine
    stream = reader._Stream(ours, reader.Deadline(5), "chat completion")
    answer = reader.Answer(stream, 200, "OK", {}, "POST", 32768)
    try:
        answer.body()
    except reader.EngineError as exc:
        return str(exc)
    finally:
        ours.close()
        engine.close()
    return None


def _link_dir(dest, outside):
    (dest / "sub").symlink_to(outside)
    (dest / "sub2").symlink_to(outside)


def _link_record_dir(dest, outside):
    (dest / ".servefleet").symlink_to(outside)


def _link_hf_meta(dest, outside):
    (dest / ".cache/huggingface").mkdir(parents=True)
    (dest / ".cache/huggingface/download").symlink_to(outside)
    (dest / "a.safetensors.stale").write_bytes(b"x")  # its metadata would be deleted outside


def _fifo(dest, outside):
    os.mkfifo(dest / "weights.safetensors")


def _planted(dest, outside):
    (dest / "extra.safetensors").write_bytes(b"planted weights")
    (dest / "modeling_qwen.py").write_text("import os; os.system('id')\n")


def _etc(dest, outside):
    (dest / "config.json").symlink_to("/etc/passwd")
    (dest / "etc").symlink_to("/etc")


def _loop(dest, outside):
    (dest / "loop").symlink_to(".")
    (dest / "deep").mkdir()
    (dest / "deep/up").symlink_to("..")


CASES = [
    harmless(
        CATEGORY,
        "fetch: directory links to outside",
        "link removed, outside unchanged",
        fetch_with(_link_dir),
    ),
    harmless(
        CATEGORY,
        "fetch: .servefleet is a link outside",
        "record written inside",
        fetch_with(_link_record_dir),
    ),
    harmless(
        CATEGORY,
        "fetch: hf metadata dir is a link outside",
        "outside metadata kept",
        fetch_with(_link_hf_meta),
    ),
    harmless(CATEGORY, "fetch: a FIFO among the shards", "removed, no hang", fetch_with(_fifo)),
    harmless(
        CATEGORY, "fetch: planted shard and *.py", "removed, not recorded", fetch_with(_planted)
    ),
    harmless(
        CATEGORY,
        "fetch: links to /etc/passwd and /etc",
        "links removed, /etc untouched",
        fetch_with(_etc),
    ),
    harmless(CATEGORY, "fetch: link loops", "removed, no endless walk", fetch_with(_loop)),
    refused(
        CATEGORY,
        "fetch: delete through a directory link",
        "symlink or not a directory",
        lambda: _unlink_through_link(),
    ),
    harmless(
        CATEGORY,
        "forged record in the directory",
        "root's record in state/ is read",
        forged_record_is_ignored,
    ),
    harmless(
        CATEGORY,
        "unlisted *.py next to a verified model",
        "drift, named",
        unlisted_file_voids_the_record,
    ),
    harmless(CATEGORY, "listing: a link to /", "listed, not walked", listing_follows_no_link),
    refused_read(
        "config.json: a link to /etc/shadow",
        lambda d: (d / "config.json").symlink_to("/etc/shadow"),
        "symlink: refused",
    ),
    refused_read(
        "config.json: a FIFO", lambda d: os.mkfifo(d / "config.json"), "not regular: refused"
    ),
    refused_read(
        "config.json: a directory", lambda d: (d / "config.json").mkdir(), "not regular: refused"
    ),
    refused_read(
        "config.json: 5 MiB",
        lambda d: (d / "config.json").write_bytes(b" " * 8192),
        "larger than 4096 bytes",
    ),
    harmless(
        CATEGORY,
        "eviction: links to /etc, loops, FIFO",
        "only the model's file",
        evict_follows_no_link,
    ),
    answer_refused("health: answer nested 100000 deep", b"[" * 100_000, "nests deeper"),
    answer_refused("health: NaN in the answer", b'{"choices": NaN}', "NaN is not a JSON number"),
    refused(CATEGORY, "health: an answer that never ends", "larger than", endless_answer),
]


def _unlink_through_link():
    with model_dir() as (dest, outside):
        (dest / "d").symlink_to(outside)
        try:
            FM.unlink_inside(dest, "d/a.safetensors")
        except FM.Failure as exc:
            assert (outside / "a.safetensors").exists()
            return str(exc)
    return None
