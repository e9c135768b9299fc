#!/usr/bin/env python3
"""Python half of tests/device/pack_payload.sh (read that first). Run with the project venv.

pack_payload.py vllm-pins CARRIED        vllm==0.24.0 + the 88 pins of carried-wheels.txt
pack_payload.py sf-pins CARRIED          the closure of pyinfra + gguf (less numpy) at this
                                         venv's versions, for a cp312 Linux x86_64 target;
                                         the pins also in the vLLM set (same version) are
                                         marked `shared`
pack_payload.py pick DIR PIN...          the wheel in DIR for each name==version pin
pack_payload.py llama DEST               DEST/llama.cpp-b9785.tar.gz (llama_src.export_tree,
                                         trim "mirror", its commit checked against
                                         llama_src.PINNED) + the tiny field GGUF
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from importlib.metadata import distribution
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
VLLM_PIN = "vllm==0.24.0"
VLLM_WHEEL_SHA256 = "2d2831aeba311292250df0132dbc4d8e9f42c654536eaec48e6fe58acb1822cf"
SF_ROOTS = ("pyinfra", "gguf")
SF_SKIP = {"numpy"}  # gguf's numpy: the GPU image has its own (torch needs it)
# The device's python3: CPython 3.12 on Linux x86_64.
TARGET = {
    **default_environment(),
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}


def carried_pins(carried: str) -> list[str]:
    """carried-wheels.txt: `name==version` a line; the vllm line carries its wheel's sha256."""
    pins = []
    for line in Path(carried).read_text().splitlines():
        word = line.split()[0] if line.strip() else ""
        if not word or word.startswith("#"):
            continue
        if word == VLLM_PIN:
            if VLLM_WHEEL_SHA256 not in line:
                raise SystemExit(f"{carried}: the vllm line names another wheel: {line}")
            continue
        pins.append(word)
    if len(pins) != 88:
        raise SystemExit(f"{carried}: {len(pins)} dependency pins, not 88")
    return [VLLM_PIN, *pins]


def sf_closure() -> dict[str, str]:
    """{canonical name: version} of SF_ROOTS' closure in this venv minus SF_SKIP, markers
    evaluated for TARGET."""
    seen: dict[str, str] = {}
    todo = list(SF_ROOTS)
    while todo:
        dist = distribution(todo.pop())
        key = canonicalize_name(dist.metadata["Name"])
        if key in seen or key in SF_SKIP:
            continue
        seen[key] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate(TARGET):
                todo.append(req.name)
    return dict(sorted(seen.items()))


def cmd_sf_pins(carried: str) -> int:
    vllm = {canonicalize_name(p.split("==")[0]): p.split("==")[1] for p in carried_pins(carried)}
    for name, version in sf_closure().items():
        if name in vllm and vllm[name] != version:
            print(
                f"note: {name} {version} here, {vllm[name]} in the vLLM set: carried twice",
                file=sys.stderr,
            )
        print(f"{name}=={version}" + (" shared" if vllm.get(name) == version else ""))
    return 0


def cmd_pick(directory: str, pins: list[str]) -> int:
    wheels: dict[tuple[str, str], list[Path]] = {}
    for path in Path(directory).glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(path.name)
        wheels.setdefault((name, str(version)), []).append(path)
    bad = []
    for pin in pins:
        name, version = pin.split("==")
        found = wheels.get((canonicalize_name(name), version), [])
        if len(found) != 1:
            bad.append(f"{pin}: {len(found)} wheels in {directory}")
        else:
            print(found[0])
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 1
    return 0


def cmd_llama(dest: str) -> int:
    sys.path.insert(0, str(REPO))
    from servefleet_dev.testing import llama_src, tiny_models

    dest_dir = Path(dest)
    dest_dir.mkdir(parents=True, exist_ok=True)
    tag = llama_src.RELEASE_TAG  # b9785
    with tempfile.TemporaryDirectory(prefix="pack-llama-") as tmp:
        tree = llama_src.export_tree(Path(tmp) / "llama.cpp", "mirror", tag)
        sha = llama_src.commit_tree(tree, Path(tmp) / "check.git", tag)
        if sha != llama_src.PINNED[tag]:
            raise SystemExit(f"b9785 mirror-trim commit {sha} != pinned {llama_src.PINNED[tag]}")
        print(f"b9785 tree (trim mirror): commit {sha} = llama_src.PINNED", file=sys.stderr)
        subprocess.run(
            f"tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner "
            f"-C {tmp} -cf - llama.cpp | gzip -n -9 > "
            f"{dest_dir / 'llama.cpp-b9785.tar.gz'}",
            shell=True,
            check=True,
        )
    gguf = tiny_models.build_tiny_gguf(
        dest_dir / "tiny-qwen35moe-field-missing-mtp.gguf",
        layout=tiny_models.GGUF_FIELD_MISSING_MTP,
    )
    res = subprocess.run(
        [sys.executable, str(REPO / "servefleet/core/lint/gguf_lint.py"), "--flag", str(gguf)],
        capture_output=True,
        text=True,
        check=True,
    )
    known = re.search(
        r'KNOWN_FLAG = "([^"]+)"', (REPO / "tests/device/llama_probe.py").read_text()
    ).group(1)
    if res.stdout.strip() != known:
        raise SystemExit(f"gguf lint flag {res.stdout.strip()!r} != llama_probe's {known!r}")
    print(f"tiny GGUF lint flag = llama_probe.KNOWN_FLAG ({known})", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["vllm-pins"] and len(argv) == 2:
        print("\n".join(carried_pins(argv[1])))
        return 0
    if argv[:1] == ["sf-pins"] and len(argv) == 2:
        return cmd_sf_pins(argv[1])
    if argv[:1] == ["pick"] and len(argv) >= 2:
        return cmd_pick(argv[1], argv[2:])
    if argv[:1] == ["llama"] and len(argv) == 2:
        return cmd_llama(argv[1])
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
