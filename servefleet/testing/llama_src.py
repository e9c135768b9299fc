"""A local git mirror of real llama.cpp source, for the testbed and the GPU probe.

The llama.cpp that PyPI's llama-cpp-python sdist vendors (`vendor/llama.cpp`, commit 0c1e570,
with qwen35moe and tools/server) is committed into a bare repository with a fixed author,
committer, dates and message, so its commit sha depends on the source alone: the same sdist and
trim always give the same sha, which group_data/testbed_rtx4090.py pins (`llamacpp_commit`).

    shared_dir()/git/llama.cpp.git      the bare mirror; guests see it at
                                        /var/cache/servefleet/git/llama.cpp.git

Trims (files no build reads):
- "mirror": docs/ and the test vocabularies models/*.gguf (176 -> 64 MiB).
- "device": also tests/, benches/, tools/ui/tests/ and the ggml backends the probe does not
  build, so the tree travels to a GPU machine (< 60 MiB). Needs LLAMA_BUILD_TESTS=OFF.

    python -m servefleet.testing.llama_src                       # ensure the testbed mirror
    python -m servefleet.testing.llama_src --export DIR --trim device   # a plain tree
    python -m servefleet.testing.llama_src --commit-dir DIR --mirror OUT.git  # DIR -> repo
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from servefleet.testing.llama_build import LLAMA_CPP_PYTHON_VERSION, _sdist

TAG = f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"  # label only: the commit is the pin
MIRROR_NAME = "llama.cpp.git"
GUEST_URL = f"/var/cache/servefleet/git/{MIRROR_NAME}"  # the mirror as testbed guests see it

# Fixed identity and dates: the commit sha is a function of the tree alone.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "servefleet", "GIT_AUTHOR_EMAIL": "servefleet@localhost",
    "GIT_COMMITTER_NAME": "servefleet", "GIT_COMMITTER_EMAIL": "servefleet@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent",  # no user config changes what is added
}
_GIT_CFG = ["-c", "core.autocrlf=false", "-c", "core.fileMode=true", "-c", "core.symlinks=true",
            "-c", "init.defaultBranch=master", "-c", "gc.auto=0"]

TRIMS = {
    "mirror": ["docs", "models/*.gguf"],
    "device": ["docs", "models/*.gguf", "tests", "benches", "tools/ui/tests", "examples", "pocs",
               "media", "gguf-py/tests",
               *[f"ggml/src/ggml-{b}" for b in ("sycl", "opencl", "hexagon", "vulkan", "metal",
                                                  "webgpu", "et", "cann", "musa", "kompute",
                                                  "zdnn", "openvino", "virtgpu", "rpc", "zendnn",
                                                  "blas")]],
}


def _git(args: list[str], cwd: Path | None = None) -> str:
    out = subprocess.run(["git", *_GIT_CFG, *args], cwd=cwd, check=True, capture_output=True,
                         text=True, env={**os.environ, **_GIT_ENV})
    return out.stdout.strip()


def export_tree(dest: Path, trim: str = "mirror") -> Path:
    """Unpack vendor/llama.cpp of the cached sdist into dest (must not exist), trimmed."""
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists; remove it first")
    prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(_sdist()) as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix) and member.name != prefix.rstrip("/"):
                member.name = member.name[len(prefix):]
                members.append(member)
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, members=members, **kwargs)
    for pattern in TRIMS[trim]:
        for path in tmp.glob(pattern):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    tmp.rename(dest)
    return dest


def commit_tree(tree: Path, mirror: Path, tag: str = TAG) -> str:
    """Commit every file of tree (ignore rules off) and push it as master + tag into a bare mirror.

    Returns the commit sha, which depends only on the files of tree.
    """
    tree, mirror = Path(tree), Path(mirror)
    gitdir = Path(tempfile.mkdtemp(prefix="llama-src-git-"))
    try:
        base = ["--git-dir", str(gitdir / "repo"), "--work-tree", str(tree)]
        _git(["init", "-q", "--bare", str(gitdir / "repo")])
        _git([*base, "add", "-A", "-f", "."])
        _git([*base, "commit", "-q", "--no-gpg-sign", "--no-verify", "-m",
              f"llama.cpp as vendored by llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}"])
        sha = _git([*base, "rev-parse", "HEAD"])
        _git([*base, "tag", "-f", tag, sha])
        if not (mirror / "HEAD").exists():
            mirror.parent.mkdir(parents=True, exist_ok=True)
            _git(["init", "-q", "--bare", str(mirror)])
        _git(["--git-dir", str(gitdir / "repo"), "push", "-q", "-f", str(mirror),
              "master:refs/heads/master", f"refs/tags/{tag}:refs/tags/{tag}"])
        return sha
    finally:
        shutil.rmtree(gitdir, ignore_errors=True)


def mirror_commit(mirror: Path, tag: str = TAG) -> str | None:
    """The commit the mirror's tag names, or None when there is no such mirror or tag."""
    try:
        return _git(["--git-dir", str(mirror), "rev-parse", "-q", "--verify",
                     f"refs/tags/{tag}^{{commit}}"]) or None
    except subprocess.CalledProcessError:
        return None


def testbed_mirror() -> Path:
    from servefleet.testbed.hosts import shared_dir

    return shared_dir() / "git" / MIRROR_NAME


def ensure_mirror(mirror: Path | None = None, trim: str = "mirror", tag: str = TAG) -> str:
    """Make the mirror once (idempotent, safe for concurrent callers); return the tag's commit."""
    mirror = Path(mirror) if mirror else testbed_mirror()
    sha = mirror_commit(mirror, tag)
    if sha:
        return sha
    mirror.parent.mkdir(parents=True, exist_ok=True)
    with open(mirror.parent / f".{mirror.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sha = mirror_commit(mirror, tag)
        if sha:
            return sha
        with tempfile.TemporaryDirectory(prefix="llama-src-") as tmp:
            tree = export_tree(Path(tmp) / "llama.cpp", trim)
            return commit_tree(tree, mirror, tag)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", metavar="DIR", help="write the trimmed tree to DIR instead")
    p.add_argument("--commit-dir", metavar="DIR", help="commit an exported tree DIR into --mirror")
    p.add_argument("--mirror", metavar="DIR.git", help="bare repo (default: the testbed's)")
    p.add_argument("--trim", choices=sorted(TRIMS), default="mirror")
    args = p.parse_args(argv)
    if args.export:
        print(export_tree(Path(args.export), args.trim))
    elif args.commit_dir:
        print(commit_tree(Path(args.commit_dir), Path(args.mirror or testbed_mirror())))
    else:
        print(ensure_mirror(Path(args.mirror) if args.mirror else None, args.trim))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
