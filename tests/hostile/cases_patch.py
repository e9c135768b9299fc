"""Hostile patch targets: vllm_patch.apply / revert run on venvs that are not what they seem.
Each is refused naming what was found, and leaves every file as it was (checked)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from servefleet_dev.testing.wheels import vllm_wheel, wheel_member
from tests.hostile.table import Case, harmless

CATEGORY = "patch targets"
REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
MODEL_FILE = "vllm/model_executor/models/qwen3_5.py"


def make_venv(
    root: Path,
    version: str = "0.24.0",
    metadata_version: str | None = None,
    pythons=("python3.12",),
) -> Path:
    """A venv layout holding vLLM's real qwen3_5.py and METADATA."""
    wheel = vllm_wheel(version)
    venv = root / "venv"
    for py in pythons:
        site = venv / "lib" / py / "site-packages"
        (site / MODEL_FILE).parent.mkdir(parents=True)
        (site / MODEL_FILE).write_bytes(wheel_member(wheel, MODEL_FILE))
        meta = wheel_member(wheel, f"vllm-{version}.dist-info/METADATA").decode()
        if metadata_version:
            meta = meta.replace(f"Version: {version}\n", f"Version: {metadata_version}\n")
        dist = site / f"vllm-{metadata_version or version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(meta)
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    return venv


def target(venv: Path) -> Path:
    return next(venv.glob(f"lib/python3.*/site-packages/{MODEL_FILE}"))


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(root))] = "-> " + os.readlink(p)
        elif p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:  # never opened: a FIFO would block
            out[str(p.relative_to(root))] = "fifo" if p.is_fifo() else "dir" if p.is_dir() else "?"
    return out


def op(name: str, venv: Path, work: Path) -> subprocess.CompletedProcess:
    (work / "bin").mkdir(exist_ok=True)
    args = [f"venv={venv}"] + ([f"workdir={work / 'bin'}"] if name == "apply" else [])
    return subprocess.run(
        [PYINFRA, "@local", f"servefleet.engines.vllm.operations.patch.{name}", *args, "-y"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused_unchanged(name: str, expected: str, prepare, which: str = "apply"):
    """The operation on the prepared venv fails naming `expected`; no file of the venv (or
    outside it) changes."""

    def check():
        root = Path(tempfile.mkdtemp(prefix="servefleet-patch-"))
        try:
            venv, watched = prepare(root)
            before = {str(w): snapshot(w) if w.is_dir() else w.read_bytes() for w in watched}
            done = op(which, venv, root)
            out = done.stdout + done.stderr
            assert done.returncode != 0, f"accepted: {out[-800:]}"
            assert "Traceback" not in out, out[-1500:]
            assert expected in out, f"the refusal does not name {expected!r}: {out[-1200:]}"
            after = {str(w): snapshot(w) if w.is_dir() else w.read_bytes() for w in watched}
            assert after == before, "files changed"
        finally:
            shutil.rmtree(root, ignore_errors=True)

    return Case(CATEGORY, name, f"refused: {expected}; nothing changed", check)


def no_vllm(root):
    venv = root / "venv"
    (venv / "lib/python3.12/site-packages").mkdir(parents=True)
    return venv, [venv]


def unrecorded(root):
    venv = make_venv(root, metadata_version="0.25.0")
    return venv, [venv]


def edited(root):
    venv = make_venv(root)
    with open(target(venv), "a") as f:
        f.write("# a local edit\n")
    return venv, [venv]


def foreign_orig(root):
    venv = make_venv(root)
    Path(str(target(venv)) + ".orig").write_text("# not vLLM's\n")
    return venv, [venv]


def patched_without_orig(root):
    venv = make_venv(root)
    # Patch it through the applier, then lose the backup.
    done = op("apply", venv, root)
    assert done.returncode == 0, done.stdout + done.stderr
    os.unlink(str(target(venv)) + ".orig")
    return venv, [venv]


def two_site_packages(root):
    venv = make_venv(root, pythons=("python3.11", "python3.12"))
    return venv, [venv]


def symlink_to_system_file(root):
    venv = make_venv(root)
    victim = root / "victim.txt"
    victim.write_text("a system file\n")
    t = target(venv)
    t.unlink()
    t.symlink_to(victim)
    return venv, [venv, victim]


def orig_symlink_out(root):
    venv = make_venv(root)
    victim = root / "victim.txt"
    victim.write_text("a system file\n")
    Path(str(target(venv)) + ".orig").symlink_to(victim)
    return venv, [venv, victim]


def metadata_lies(root):
    venv = make_venv(root, version="0.26.0", metadata_version="0.24.0")  # 0.26's file, says 0.24
    return venv, [venv]


def empty_model_file(root):
    venv = make_venv(root)
    target(venv).write_bytes(b"")
    return venv, [venv]


def orig_fifo(root):
    """A FIFO where the backup goes: hashing it would wait forever for a writer."""
    venv = make_venv(root)
    os.mkfifo(str(target(venv)) + ".orig")
    return venv, [venv]


def orig_directory(root):
    venv = make_venv(root)
    Path(str(target(venv)) + ".orig").mkdir()
    return venv, [venv]


def target_fifo(root):
    venv = make_venv(root)
    t = target(venv)
    t.unlink()
    os.mkfifo(t)
    return venv, [venv]


def target_directory(root):
    venv = make_venv(root)
    t = target(venv)
    t.unlink()
    t.mkdir()
    return venv, [venv]


def symlink_to_pristine_copy(root):
    """qwen3_5.py a link to a pristine copy outside the venv: the hashes match, the link is
    still refused (never followed: the backup and the result would be written through it)."""
    venv = make_venv(root)
    copy = root / "elsewhere.py"
    t = target(venv)
    copy.write_bytes(t.read_bytes())
    t.unlink()
    t.symlink_to(copy)
    return venv, [venv, copy]


def revert_foreign(root):
    venv, watched = foreign_orig(root)
    return venv, watched


def revert_edited_no_orig(root):
    return edited(root)


def _applier(t: Path, timeout: int = 20) -> subprocess.CompletedProcess:
    rec = json.loads((REPO / "files/patches/vllm/0.24.0/hashes.json").read_text())
    try:
        return subprocess.run(
            [
                sys.executable,
                str(REPO / "files/patches/vllm/apply_patch.py"),
                str(t),
                str(REPO / "files/patches/vllm/0.24.0" / rec["patch"]),
                rec["pristine_sha256"],
                rec["patched_sha256"],
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the applier still runs after {timeout} s (blocked?)") from None


def applier_refuses(prepare, expected: str, path_of=target):
    """The node-side applier, run directly (as root would, after the operation's checks), on a
    target the facts did not see: one line naming `expected`, exit 6, nothing changed."""

    def check():
        root = Path(tempfile.mkdtemp(prefix="servefleet-patch-"))
        try:
            venv, watched = prepare(root)
            before = {
                str(w): snapshot(w) if w.is_dir() else w.read_bytes()
                for w in watched
                if not w.is_fifo()
            }
            done = _applier(path_of(venv))
            assert done.returncode == 6, (done.returncode, done.stderr[-800:])
            lines = done.stderr.splitlines()
            assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-800:]
            assert expected in lines[0], lines[0]
            after = {
                str(w): snapshot(w) if w.is_dir() else w.read_bytes()
                for w in watched
                if not w.is_fifo()
            }
            assert after == before, "files changed"
        finally:
            shutil.rmtree(root, ignore_errors=True)

    return check


def fifo_target_for_applier(root):
    venv = make_venv(root)
    os.mkfifo(venv / "fifo.py")
    return venv, [venv]


def planted_tmp_symlink():
    """Links planted at every name the applier used to write through (TARGET.servefleet-tmp,
    TARGET.orig.servefleet-tmp): it writes new random names instead, so the patch is applied
    and the link targets are untouched."""
    root = Path(tempfile.mkdtemp(prefix="servefleet-patch-"))
    try:
        venv = make_venv(root)
        t = target(venv)
        victims = []
        for suffix in (".servefleet-tmp", ".orig.servefleet-tmp"):
            victim = root / f"victim{suffix}"
            victim.write_text("a system file\n")
            Path(str(t) + suffix).symlink_to(victim)
            victims.append(victim)
        done = _applier(t)
        assert done.returncode == 0, done.stderr[-800:]
        assert all(v.read_text() == "a system file\n" for v in victims), "wrote through a link"
        assert not t.is_symlink() and Path(str(t) + ".orig").is_file()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def applier_with_wrong_hashes():
    root = Path(tempfile.mkdtemp(prefix="servefleet-patch-"))
    try:
        venv = make_venv(root)
        t = target(venv)
        before = t.read_bytes()
        patch = REPO / "files/patches/vllm/0.24.0/qwen3_5.py.patch"
        done = subprocess.run(
            [
                sys.executable,
                str(REPO / "files/patches/vllm/apply_patch.py"),
                str(t),
                str(patch),
                "0" * 64,
                "1" * 64,
            ],
            capture_output=True,
            text=True,
        )
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert t.read_bytes() == before and not Path(str(t) + ".orig").exists()
    finally:
        shutil.rmtree(root, ignore_errors=True)


CASES = [
    refused_unchanged("a venv without vLLM", "no vLLM in", no_vllm),
    refused_unchanged("a vLLM version without a recorded patch", "no patch recorded", unrecorded),
    refused_unchanged("a locally edited qwen3_5.py", "which is neither the pristine", edited),
    refused_unchanged("a backup that is not vLLM's file", "not the pristine", foreign_orig),
    refused_unchanged("a patched file without its backup", "is missing", patched_without_orig),
    refused_unchanged("two site-packages in one venv", "more than one", two_site_packages),
    refused_unchanged(
        "qwen3_5.py linked to another file", "is a symbolic link", symlink_to_system_file
    ),
    refused_unchanged(
        "qwen3_5.py linked to a pristine copy outside the venv",
        "is a symbolic link, not a regular file",
        symlink_to_pristine_copy,
    ),
    refused_unchanged(
        "a FIFO where the backup goes (would hang its hash)",
        "qwen3_5.py.orig is a fifo, not a regular file",
        orig_fifo,
    ),
    refused_unchanged(
        "revert with a FIFO where the backup is",
        "qwen3_5.py.orig is a fifo",
        orig_fifo,
        which="revert",
    ),
    refused_unchanged(
        "a directory where the backup goes", "qwen3_5.py.orig is a directory", orig_directory
    ),
    refused_unchanged("qwen3_5.py a FIFO", "has no model file qwen3_5.py", target_fifo),
    refused_unchanged("qwen3_5.py a directory", "has no model file qwen3_5.py", target_directory),
    refused_unchanged(
        "a backup linked to another file", "qwen3_5.py.orig is a symbolic link", orig_symlink_out
    ),
    refused_unchanged(
        "METADATA claiming another release", "which is neither the pristine", metadata_lies
    ),
    refused_unchanged("an empty qwen3_5.py", "which is neither the pristine", empty_model_file),
    refused_unchanged(
        "revert with a foreign backup", "not the pristine", revert_foreign, which="revert"
    ),
    refused_unchanged(
        "revert of an edited file without a backup",
        "no backup",
        revert_edited_no_orig,
        which="revert",
    ),
    harmless(
        CATEGORY,
        "the applier run on a FIFO",
        "exit 6 at once, one line, nothing changed",
        applier_refuses(
            fifo_target_for_applier, "not a regular file", path_of=lambda venv: venv / "fifo.py"
        ),
    ),
    harmless(
        CATEGORY,
        "the applier run on a link to a pristine copy",
        "exit 6, one line, the copy and the venv unchanged",
        applier_refuses(symlink_to_pristine_copy, "is a symbolic link"),
    ),
    harmless(
        CATEGORY,
        "the applier with a link planted as its backup",
        "exit 6, one line, the link's target unchanged",
        applier_refuses(orig_symlink_out, ".orig is a symbolic link"),
    ),
    harmless(
        CATEGORY,
        "links planted at the applier's old temporary names",
        "applied through new random names; the links' targets unchanged",
        planted_tmp_symlink,
    ),
    harmless(
        CATEGORY,
        "the applier given hashes that match nothing",
        "it exits non-zero, one line, and the file and its backup are untouched",
        applier_with_wrong_hashes,
    ),
]
