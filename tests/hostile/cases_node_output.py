"""Node output is bytes (servefleet/core/node_output.py): names and file contents a node's user
controls reach the operator whole, whatever bytes they hold, and an answer that is cut short or
undecodable never reads as a clean one. Each case runs the fact's own command in a real shell
here, on files made with those bytes, and decodes its output as pyinfra does (strict UTF-8
lines), then the fact's own parser."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

from servefleet.core import models
from servefleet.facts.models import ModelFile, ModelRecordFiles, VerifiedModel
from servefleet.facts.node import DirEntries
from tests.hostile.table import harmless, refused

CATEGORY = "node output"
REPO = Path(__file__).resolve().parents[2]


def shell(command: str) -> list[str]:
    out = subprocess.run(["sh", "-c", command], capture_output=True, timeout=30).stdout
    return out.decode("utf-8").splitlines()  # pyinfra's reader: strict; this must not raise


def model_dir(tmp: str, names: dict[bytes, bytes], listed: dict[str, int]):
    model, record = Path(tmp) / "m", Path(tmp) / "record.json"
    model.mkdir()
    for name, body in names.items():
        path = os.path.join(os.fsencode(model), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(body)
    record.write_text(json.dumps({"files": listed}))
    return {"path": str(model), "record": str(record), "user": "root"}


def listing_case(name: bytes, shown: str):
    """A planted file next to a listed one: never verified, named whole on one line."""

    def check():
        with tempfile.TemporaryDirectory() as tmp:
            args = model_dir(tmp, {b"config.json": b"{}", name: b"x"}, {"config.json": 2})
            assert VerifiedModel().process(shell(VerifiedModel().command(**args))) is None
            raw = ModelRecordFiles().process(shell(ModelRecordFiles().command(**args)))
            reason = models.invalid_record_reason(*raw)
            assert reason == f"not part of the model: {shown}", reason
            assert "\n" not in reason and "\r" not in reason

    return harmless(CATEGORY, f"a planted name {name!r}", f"named as {shown}", check)


def forged_line():
    # The name forges a listing line that would make the listed file look present.
    with tempfile.TemporaryDirectory() as tmp:
        args = model_dir(
            tmp, {b"config.json\n2 w.safetensors": b"x"}, {"config.json": 2, "w.safetensors": 2}
        )
        raw = ModelRecordFiles().process(shell(ModelRecordFiles().command(**args)))
        assert VerifiedModel().process(shell(VerifiedModel().command(**args))) is None
        assert "missing: config.json, w.safetensors" in models.invalid_record_reason(*raw)


def verified_as_is():
    # The control: an intact directory is verified through the same encoding.
    with tempfile.TemporaryDirectory() as tmp:
        args = model_dir(
            tmp,
            {b"config.json": b"{}", b"w/x y.safetensors": b"abc"},
            {"config.json": 2, "w/x y.safetensors": 3},
        )
        assert VerifiedModel().process(shell(VerifiedModel().command(**args))) is not None


def file_read(body: bytes):
    def attempt():
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.json"
            path.write_bytes(body)
            got = ModelFile().process(shell(ModelFile().command(str(path), "root", 1024)))
            return got[0]

    return attempt


def file_text_whole():
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_bytes(b'{"a": "\\u2028"}\r\n\n\n')
        got = ModelFile().process(shell(ModelFile().command(str(path), "root", 1024)))
        assert got == (None, '{"a": "\\u2028"}\r\n\n\n'), got  # every byte, CR and blank lines too


def dir_entries():
    with tempfile.TemporaryDirectory() as tmp:
        for name in (b"plain", b"new\nline", b"bad\xff", b" lead"):
            open(os.path.join(os.fsencode(tmp), name), "w").close()
        got = DirEntries().process(shell(DirEntries().command(tmp).get_raw_value()))
        assert got == sorted([" lead", os.fsdecode(b"bad\xff"), "new\nline", "plain"]), got


def fetcher_one_line():
    fetcher = str(REPO / "files/model/fetch_model.py")
    out = subprocess.run(
        [
            "python3",
            "-c",
            "import sys, importlib.util as u; "
            f"s = u.spec_from_file_location('f', {fetcher!r}); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); "
            "m.log('removing ' + b'x\\xff\\ny'.decode('utf-8', 'surrogateescape'))",
        ],
        capture_output=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode("utf-8") == "servefleet: removing x\\xff\\ny\n", out.stdout


def cut_short():
    lines = shell(
        ModelRecordFiles().command(**model_dir(tempfile.mkdtemp(), {b"a": b"x"}, {"a": 1}))
    )
    lines[-1] = lines[-1][:-2] + "!"
    assert (
        models.invalid_record_reason(*ModelRecordFiles().process(lines))
        == models.LISTING_UNREADABLE
    )


def _cases():
    return [
        listing_case(b"bad\xffname.safetensors", "bad\\xffname.safetensors"),
        listing_case(b"\xc3\x28.py", "\\xc3(.py"),
        listing_case(b"new\nline.py", "new\\nline.py"),
        listing_case(b"cr\rreturn.py", "cr\\rreturn.py"),
        listing_case(b"esc\x1b[31mred.py", "esc\\x1b[31mred.py"),
        listing_case("sep\u2028line.py".encode(), "sep\\u2028line.py"),
        listing_case("nel\u0085.py".encode(), "nel\\x85.py"),
        listing_case(b"sub/dir/\xfe.bin", "sub/dir/\\xfe.bin"),
        harmless(
            CATEGORY, "a name forging a listing line", "the forged file is missing", forged_line
        ),
        harmless(CATEGORY, "an intact directory (control)", "verified", verified_as_is),
        refused(
            CATEGORY,
            "a config.json that is not UTF-8",
            "not UTF-8 text",
            file_read(b'{"a": "\xff"}'),
        ),
        harmless(
            CATEGORY, "a config.json with CR, U+2028 and blank lines", "read whole", file_text_whole
        ),
        harmless(
            CATEGORY,
            "directory names with a newline and a non-UTF-8 byte",
            "each name whole",
            dir_entries,
        ),
        harmless(
            CATEGORY, "the fetcher removing a non-UTF-8 name", "said on one line", fetcher_one_line
        ),
        harmless(CATEGORY, "a listing cut short", "never verified, said so", cut_short),
    ]


def _round3():
    """More names and contents a node's user controls (#27 rule 3): each reaches the operator
    whole and escaped (core.node_output.shown, which now escapes bidi controls too)."""
    return [
        listing_case("rlo\u202egnp.py".encode(), "rlo\\u202egnp.py"),
        listing_case("lre\u202ax.py".encode(), "lre\\u202ax.py"),
        listing_case("alm\u061cx.py".encode(), "alm\\u061cx.py"),
        listing_case("para\u2029x.py".encode(), "para\\u2029x.py"),
        listing_case(b"del\x7fx.py", "del\\x7fx.py"),
        listing_case(b"bel\x07x.py", "bel\\x07x.py"),
        listing_case(b"tab\tx.py", "tab\\tx.py"),
        listing_case(b"#servefleet-sizes", "#servefleet-sizes"),  # the fact's own separator
        listing_case(b"cut\xe2\x80.py", "cut\\xe2\\x80.py"),  # a UTF-8 sequence cut short
        listing_case(b"\xff" * 100, "\\xff" * 100),
        refused(
            CATEGORY,
            "a config.json with an overlong UTF-8 '/'",
            "not UTF-8 text",
            file_read(b'{"a": "\xc0\xaf"}'),
        ),
        refused(
            CATEGORY,
            "a config.json with a UTF-8-encoded surrogate",
            "not UTF-8 text",
            file_read(b'{"a": "\xed\xa0\x80"}'),
        ),
    ]


CASES = _cases() + _round3()
