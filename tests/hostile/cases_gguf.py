"""Hostile GGUF files fed to `servefleet inspect FILE --json`.

Every file is built small, in a temporary directory, when the case is checked. A refusal must be
exit status 2 with one line on stderr naming the file and the problem, within seconds: the header
is checked against the file's size before gguf.GGUFReader sees it (servefleet/core/lint/gguf_lint.py).

Also home of `run_cli` / `cli_refusal`, which the other cases_* modules of the lints use.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import struct
import tempfile
import threading
import traceback
from pathlib import Path

from servefleet.engines.llamacpp.logic import parse_lint
from tests.hostile.table import harmless, refused

CATEGORY = "GGUF files"
TIMEOUT_S = 20


# --- running the CLI in-process -------------------------------------------------------------------


class _Hung(BaseException):
    """Raised by the alarm: a BaseException, so no `except Exception` under test swallows it."""


@contextlib.contextmanager
def _deadline(seconds: int):
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def alarm(signum, frame):
        raise _Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(*argv, timeout: int = TIMEOUT_S) -> tuple[int | str, str, str]:
    """`servefleet ARGV` in-process: (exit status, stdout, stderr). An exception that escapes
    main() comes back as the status "traceback" with the traceback as stderr."""
    from servefleet.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with _deadline(timeout), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main([str(a) for a in argv])
            except SystemExit as exc:  # argparse
                rc = exc.code if isinstance(exc.code, int) else 2
    except _Hung as exc:
        raise AssertionError(f"servefleet {argv[0]} hangs: {exc}") from None
    except Exception:  # noqa: BLE001 - the point: a traceback is a failure to report, not raise
        return "traceback", out.getvalue(), err.getvalue() + traceback.format_exc()
    return rc, out.getvalue(), err.getvalue()


def cli_refusal(*argv) -> str | None:
    """The one line `servefleet ARGV` refuses the input with (exit 2); None when it accepted it
    (exit 0 or 1). A traceback comes back as the message (the table reports it); a refusal that
    is not exactly one line on stderr with exit status 2 is an AssertionError."""
    rc, out, err = run_cli(*argv)
    if rc == "traceback":
        return err
    if rc in (0, 1):
        return None
    lines = err.splitlines()
    assert rc == 2, f"exit status {rc}, expected 2; stderr: {err[-500:]!r}"
    assert len(lines) == 1 and err.endswith("\n"), f"refusal is not one line: {err[-800:]!r}"
    assert len(lines[0]) < 1200, f"refusal line of {len(lines[0])} characters"
    return lines[0]


def same_output(*argv_pairs) -> None:
    """Each argv gives exit 0 and the same stdout as the first."""
    results = [run_cli(*argv) for argv in argv_pairs]
    for argv, (rc, _out, err) in zip(argv_pairs, results, strict=True):
        assert rc == 0, f"servefleet {' '.join(map(str, argv))}: exit {rc}: {err[-800:]}"
    first = results[0][1]
    for _, out, _ in results[1:]:
        assert out == first, f"output differs from the clean input's:\n{out}\nversus\n{first}"


# --- GGUF bytes -------------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
GGML_F32 = 0


def gstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def kv_str(key, value) -> bytes:
    return kv(key, STRING, gstr(value))


def kv_u32(key, value: int) -> bytes:
    return kv(key, U32, struct.pack("<I", value))


def tensor_info(name: str | bytes, dims, ggml_type: int = GGML_F32, offset: int = 0) -> bytes:
    return (
        gstr(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<I", ggml_type)
        + struct.pack("<Q", offset)
    )


BLOCKS = (
    tensor_info("blk.0.attn_norm.weight", [4], offset=0),
    tensor_info("blk.1.attn_norm.weight", [4], offset=32),
)
BASE_KVS = (kv_str("general.architecture", "llama"), kv_u32("llama.block_count", 2))


def gguf_bytes(
    kvs=BASE_KVS,
    tensors=BLOCKS,
    *,
    version: int = 3,
    tensor_count=None,
    kv_count=None,
    data: bytes = bytes(48),
    alignment: int = 32,
) -> bytes:
    """A GGUF: header, key/values, tensor infos, padding, data. Counts default to the real ones."""
    head = (
        b"GGUF"
        + struct.pack("<I", version)
        + struct.pack("<Q", len(tensors) if tensor_count is None else tensor_count)
        + struct.pack("<Q", len(kvs) if kv_count is None else kv_count)
    )
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + bytes(-len(body) % alignment) + data


@contextlib.contextmanager
def scratch():
    """A temporary directory for one case's files, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="servefleet-hostile-") as tmp:
        yield Path(tmp)


def _write(directory: Path, name: str, content: bytes, sparse_to: int = 0) -> Path:
    path = directory / name
    path.write_bytes(content)
    if sparse_to:  # a large file that takes no disk space
        with open(path, "r+b") as f:
            f.truncate(sparse_to)
    return path


def inspect_bytes(content: bytes, file_name: str = "model.gguf", sparse_to: int = 0):
    def attempt():
        with scratch() as tmp:
            return cli_refusal("inspect", _write(tmp, file_name, content, sparse_to), "--json")

    return attempt


def case(name: str, expected: str, content: bytes, **kw):
    return refused(CATEGORY, name, expected, inspect_bytes(content, **kw))


def _fifo():
    with scratch() as tmp:
        os.mkfifo(tmp / "model.gguf")
        return cli_refusal("inspect", tmp / "model.gguf", "--json")


def _clean_json(content: bytes) -> dict:
    with scratch() as tmp:
        rc, out, err = run_cli("inspect", _write(tmp, "model.gguf", content), "--json")
    assert rc == 0, f"exit {rc}: {err[-800:]}"
    return json.loads(out)


def _harmless_extra_keys():
    vocab = 20_000
    extra = (
        kv(
            "tokenizer.ggml.tokens",
            ARRAY,
            struct.pack("<IQ", STRING, vocab) + b"".join(gstr(f"t{i}") for i in range(vocab)),
        )
        + kv("tokenizer.ggml.scores", ARRAY, struct.pack("<IQ", F32, vocab) + bytes(4 * vocab))
        + kv_str("some.unknown.key", "x" * 10_000)
        + kv_u32("general.alignment", 32)
    )
    clean = _clean_json(gguf_bytes())
    assert clean == {
        "arch": "llama",
        "block_count": 2,
        "highest_block": 1,
        "nextn_predict_layers": None,
        "defect": None,
        "override_kv": [],
    }, clean
    busy = _clean_json(gguf_bytes(kvs=BASE_KVS + (extra,), kv_count=len(BASE_KVS) + 4))
    assert busy == clean, (busy, clean)


def _harmless_unicode_digit_block():
    # "blk.\u0669" is blk.<ARABIC-INDIC DIGIT NINE>: no block llama.cpp names (it writes
    # "blk.%d"), so not counted; int() would read it as block 9 and report a defect.
    odd = tensor_info("blk.\u0669.attn_norm.weight", [4], offset=64)
    clean = _clean_json(gguf_bytes())
    odd_lint = _clean_json(gguf_bytes(tensors=BLOCKS + (odd,), data=bytes(80)))
    assert odd_lint == clean, (odd_lint, clean)


def _split_dir(tmp: Path, second: bytes | None = None) -> Path:
    """A two-shard GGUF in tmp/model/: shard 1 holds the metadata and block 0, shard 2 block 1
    (written as `second` when given, else a symlink is expected to be made by the caller)."""
    model = tmp / "model"
    model.mkdir()
    split = (kv("split.count", U16, struct.pack("<H", 2)),)
    first = gguf_bytes(kvs=BASE_KVS + split, tensors=BLOCKS[:1], data=bytes(32))
    (model / "m-00001-of-00002.gguf").write_bytes(first)
    if second is not None:
        (model / "m-00002-of-00002.gguf").write_bytes(second)
    return model


SHARD_2 = gguf_bytes(
    kvs=(kv("split.no", U16, struct.pack("<H", 1)),),
    tensors=(tensor_info("blk.1.attn_norm.weight", [4]),),
    data=bytes(32),
)


def _shard_linked_out():
    with scratch() as tmp:
        model = _split_dir(tmp)
        (tmp / "elsewhere.gguf").write_bytes(SHARD_2)
        (model / "m-00002-of-00002.gguf").symlink_to(tmp / "elsewhere.gguf")
        return cli_refusal("inspect", model / "m-00001-of-00002.gguf", "--json")


def _later_shard_given_first_linked_out():
    with scratch() as tmp:
        model = _split_dir(tmp, SHARD_2)
        (model / "m-00001-of-00002.gguf").rename(tmp / "first.gguf")
        (model / "m-00001-of-00002.gguf").symlink_to(tmp / "first.gguf")
        return cli_refusal("inspect", model / "m-00002-of-00002.gguf", "--json")


def _shard_linked_to_fifo():
    with scratch() as tmp:
        model = _split_dir(tmp)
        os.mkfifo(model / "pipe")
        (model / "m-00002-of-00002.gguf").symlink_to("pipe")
        return cli_refusal("inspect", model / "m-00001-of-00002.gguf", "--json")


def _harmless_shard_links_inside():
    """Links that stay in the model's directory (or go to a hub cache snapshot's blobs/) are
    followed: the lint is the one of the plain split."""
    with scratch() as tmp:
        plain = _split_dir(tmp, SHARD_2)
        rc, want, err = run_cli("inspect", plain / "m-00001-of-00002.gguf", "--json")
        assert rc == 0 and json.loads(want)["highest_block"] == 1, err
        snap = tmp / "models--org--m" / "snapshots" / ("a" * 40)
        blobs = tmp / "models--org--m" / "blobs"
        snap.mkdir(parents=True)
        blobs.mkdir()
        for i, name in enumerate(("m-00001-of-00002.gguf", "m-00002-of-00002.gguf")):
            (plain / name).rename(blobs / f"blob{i}")
            (snap / name).symlink_to(f"../../blobs/blob{i}")
        rc, out, err = run_cli("inspect", snap / "m-00001-of-00002.gguf", "--json")
        assert rc == 0 and out == want, (rc, err[-500:])


def _lint_flag_bounded():
    """A lint (run as the service user) printing a count no model has is not passed on to
    llama-server: the operator side reads it as an error."""
    assert parse_lint(["ok llama.block_count=int:4"]).flag == "llama.block_count=int:4"
    for flag in (
        "llama.block_count=int:" + "1" * 55,
        "llama.block_count=int:-1",
        "llama.block_count=str:x",
        "llama.block_count=int:007",
    ):
        assert parse_lint([f"ok {flag}"]).state == "error", flag


ARCH = kv_str("general.architecture", "llama")
COUNT = kv_u32("llama.block_count", 2)
HUGE = 1 << 62

CASES = [
    case("only the magic bytes", "truncated: 4 bytes", b"GGUF"),
    case("header cut after the version", "truncated: 8 bytes", b"GGUF" + struct.pack("<I", 3)),
    case("empty file named .gguf", "not a GGUF file", b""),
    case("unsupported version 99", "GGUF version 99", gguf_bytes(version=99)),
    case("big-endian version field", "big-endian GGUF", gguf_bytes(version=3 << 24)),
    case("tensor_count of 2**62", f"tensor_count {HUGE}", gguf_bytes(tensor_count=HUGE)),
    case("kv_count of 2**62", f"kv_count {HUGE}", gguf_bytes(kv_count=HUGE)),
    case("kv_count of 2**64-1", f"kv_count {(1 << 64) - 1}", gguf_bytes(kv_count=(1 << 64) - 1)),
    case(
        "kv_count far above any model, in a 64 MiB sparse file",
        "kv_count 1000000",
        gguf_bytes(kv_count=1_000_000),
        sparse_to=64 << 20,
    ),
    case(
        "key length of 2**40",
        "key 0 is 1099511627776 bytes long",
        b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 1 << 40) + b"x" * 16,
    ),
    case(
        "string value length of 2**40",
        "is 1099511627776 bytes long",
        gguf_bytes(
            kvs=(kv("general.architecture", STRING, struct.pack("<Q", 1 << 40) + b"llama"),)
        ),
    ),
    case(
        "string value of 100 MiB in a small file",
        "only",
        gguf_bytes(
            kvs=(kv("general.architecture", STRING, struct.pack("<Q", 100 << 20) + b"llama"),)
        ),
    ),
    case(
        "array of 2**62 uint32",
        f"claims {HUGE} items of uint32",
        gguf_bytes(kvs=(ARCH, COUNT, kv("x.arr", ARRAY, struct.pack("<IQ", U32, HUGE)))),
    ),
    case(
        "array of 2**40 strings",
        "claims 1099511627776 items of string",
        gguf_bytes(kvs=(ARCH, COUNT, kv("x.arr", ARRAY, struct.pack("<IQ", STRING, 1 << 40)))),
    ),
    case(
        "string array item of length 2**40",
        "item 0 of array 'x.arr' is 1099511627776 bytes long",
        gguf_bytes(kvs=(ARCH, COUNT, kv("x.arr", ARRAY, struct.pack("<IQQ", STRING, 2, 1 << 40)))),
    ),
    case(
        "10 million array items in a 64 MiB sparse file",
        "more than the 2097152 allowed",
        gguf_bytes(kvs=(ARCH, COUNT, kv("x.arr", ARRAY, struct.pack("<IQ", U8, 10_000_000)))),
        sparse_to=64 << 20,
    ),
    case(
        "array of arrays",
        "an array of arrays",
        gguf_bytes(
            kvs=(
                ARCH,
                COUNT,
                kv(
                    "x.arr", ARRAY, struct.pack("<IQ", ARRAY, 1) + struct.pack("<IQ", ARRAY, 1) * 50
                ),
            )
        ),
    ),
    case(
        "unknown value type 99",
        "unknown value type 99",
        gguf_bytes(kvs=(ARCH, COUNT, kv("x.odd", 99, b"\0" * 8))),
    ),
    case(
        "duplicate metadata key",
        "duplicate key 'general.architecture'",
        gguf_bytes(kvs=(ARCH, COUNT, ARCH)),
    ),
    case(
        "key that is not UTF-8",
        "is not UTF-8",
        gguf_bytes(kvs=(ARCH, COUNT, kv_u32(b"x.\xff\xfe", 1))),
    ),
    case(
        "architecture stored as uint32",
        "general.architecture is uint32: expected a string",
        gguf_bytes(kvs=(kv_u32("general.architecture", 7), COUNT)),
    ),
    case(
        "architecture that would inject into --override-kv",
        "general.architecture = 'llama.block_count=int:9,x': expected an architecture name",
        gguf_bytes(kvs=(kv_str("general.architecture", "llama.block_count=int:9,x"), COUNT)),
    ),
    case(
        "architecture of 1 MiB",
        "expected an architecture name",
        gguf_bytes(kvs=(kv_str("general.architecture", "a" * (1 << 20)), COUNT)),
    ),
    case("no architecture key", "no general.architecture key", gguf_bytes(kvs=(COUNT,))),
    case(
        "block_count stored as a string",
        "llama.block_count is string: expected an integer",
        gguf_bytes(kvs=(ARCH, kv_str("llama.block_count", "2"))),
    ),
    case(
        "block_count stored as an array",
        "llama.block_count is array/uint32: expected an integer",
        gguf_bytes(kvs=(ARCH, kv("llama.block_count", ARRAY, struct.pack("<IQII", U32, 2, 1, 2)))),
    ),
    case(
        "negative block_count",
        "llama.block_count = -1",
        gguf_bytes(kvs=(ARCH, kv("llama.block_count", I32, struct.pack("<i", -1)))),
    ),
    case(
        "alignment of 0",
        "general.alignment = 0: expected a power of two",
        gguf_bytes(kvs=(ARCH, COUNT, kv_u32("general.alignment", 0))),
    ),
    case(
        "alignment stored as a string",
        "general.alignment is string: expected uint32",
        gguf_bytes(kvs=(ARCH, COUNT, kv_str("general.alignment", "32"))),
    ),
    case(
        "tensor with 99 dimensions",
        "has 99 dimensions",
        gguf_bytes(tensors=(tensor_info("blk.0.attn_norm.weight", [1] * 99),)),
    ),
    case(
        "tensor of unknown type 999",
        "has unknown type 999",
        gguf_bytes(tensors=(tensor_info("blk.0.attn_norm.weight", [4], ggml_type=999),)),
    ),
    case(
        "tensor whose element count overflows",
        "not a valid F32 shape",
        gguf_bytes(tensors=(tensor_info("blk.0.attn_norm.weight", [1 << 40, 1 << 40]),)),
    ),
    case(
        "tensor data offset 2**40 past a small file",
        "runs past the end of the file",
        gguf_bytes(tensors=(tensor_info("blk.0.attn_norm.weight", [4], offset=1 << 40),)),
    ),
    case(
        "tensor name of 1000 bytes",
        "is 1000 bytes: llama.cpp allows 63",
        gguf_bytes(tensors=(tensor_info("blk.0." + "x" * 994, [4]),)),
    ),
    case(
        "duplicate tensor names",
        "duplicate tensor name 'blk.0.attn_norm.weight'",
        gguf_bytes(tensors=(BLOCKS[0], tensor_info("blk.0.attn_norm.weight", [4], offset=32))),
    ),
    case(
        "split.count of 2**31 in a 2-shard file name",
        "split.count = 2147483648 but the file name says 2",
        gguf_bytes(kvs=(ARCH, COUNT, kv("split.count", U64, struct.pack("<Q", 1 << 31)))),
        file_name="model-00001-of-00002.gguf",
    ),
    refused(
        CATEGORY, "a FIFO named model.gguf (would block a plain open)", "not a regular file", _fifo
    ),
    case(
        "a 55-digit blk.N (the override would pass it on)",
        "names block '1111",
        gguf_bytes(tensors=(BLOCKS[0], tensor_info("blk." + "1" * 55 + ".w", [4], offset=32))),
    ),
    case(
        "blk.65536, past any model",
        "more than the 65536 blocks any model has",
        gguf_bytes(tensors=(BLOCKS[0], tensor_info("blk.65536.w", [4], offset=32))),
    ),
    refused(
        CATEGORY,
        "a split shard linked out of the model's directory",
        "a symlink leading out of the model's directory",
        _shard_linked_out,
    ),
    refused(
        CATEGORY,
        "a later shard given, the first linked out of the directory",
        "a symlink leading out of the model's directory",
        _later_shard_given_first_linked_out,
    ),
    refused(
        CATEGORY,
        "a split shard linked to a FIFO in the directory",
        "not a regular file",
        _shard_linked_to_fifo,
    ),
    harmless(
        CATEGORY,
        "split shards linked inside the directory or a hub cache's blobs/",
        "followed: the lint JSON is the plain split's",
        _harmless_shard_links_inside,
    ),
    harmless(
        CATEGORY,
        "a lint printing a 55-digit block_count",
        "read as an error, no flag",
        _lint_flag_bounded,
    ),
    harmless(
        CATEGORY,
        "a 20k-token vocabulary, unknown keys and an explicit alignment",
        "the lint JSON is identical to the clean file's",
        _harmless_extra_keys,
    ),
    harmless(
        CATEGORY,
        "a blk tensor numbered with a non-ASCII digit",
        "not counted as a block: the lint JSON is identical to the clean file's",
        _harmless_unicode_digit_block,
    ),
]
