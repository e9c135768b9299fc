"""README's "Your first real node", rehearsed on the testbed exactly as written (#30): the commands
are read out of README's block, so the docs and this test cannot drift apart. Step 1 (your hosts
in fleet.yml) is `servefleet testbed fleet -o FILE` with $SERVEFLEET_FLEET pointing at it, as
docs/testbed.md says; every other step runs as written, through bash from the repository root
after `source .venv/bin/activate`; step 4 without -y, so pyinfra asks and the test presses
enter. On spark-1 with the Spark recipe as written, and on rtx4090-1 with README's RTX 4090
variant (its inventory and deploy, plan-kv skipped): the converge succeeds, a rerun changes
nothing, drift finds the host in sync, status shows its engine. Step 6 (rollout) is for after a
data change: the rollouts' own tests run it (test_rollout.py)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from servefleet_dev.testbed import material
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, read_run

pytestmark = pytest.mark.e2e
README = REPO_ROOT / "README.md"
SECTION = "## Your first real node"
TIMEOUT_S = 1800  # a fresh testbed: a converge of either recipe, the llama.cpp build from ccache


def section() -> str:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else None]


def readme_steps() -> list[str]:
    """The block's commands, comments dropped and continued lines joined."""
    block = re.search(r"```bash\n(.*?)```", section(), re.S)
    assert block, f"README.md: no bash block under {SECTION!r}"
    commands, pending = [], ""
    for line in block.group(1).splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).rstrip()
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        commands.append(pending + line.strip())
        pending = ""
    return [c for c in commands if c]


def rtx4090_variant() -> tuple[str, str, str]:
    """README's '(for an RTX 4090 node use `INVENTORY DEPLOY` and skip plan-kv)'."""
    found = re.search(
        r"for an RTX 4090 node use\s+`(inventory/\S+\.py)\s+(deploys/\S+\.py)`\s+and\s+skip\s+"
        r"(\S+)\)",
        section(),
    )
    assert found, "README.md: the RTX 4090 variant of the first-node steps is not where it was"
    return found.group(1), found.group(2), found.group(3)


def bash(command: str, fleet: Path, stdin: str = "") -> subprocess.CompletedProcess:
    """One step as a user types it: from the repository root, the venv activated."""
    return subprocess.run(
        ["bash", "-c", f"source .venv/bin/activate && {command}"],
        cwd=REPO_ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env={**os.environ, "SERVEFLEET_FLEET": str(fleet), "COLUMNS": "80", "NO_COLOR": "1"},
    )


def rehearsal_steps() -> list[str]:
    """README's rehearsal block under the steps: up, `testbed fleet -o FILE`, export FILE."""
    blocks = re.findall(r"```bash\n(.*?)```", section(), re.S)
    assert len(blocks) == 2, f"README.md: expected the steps and the rehearsal under {SECTION!r}"
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in blocks[1].splitlines()]


@pytest.fixture(scope="module")
def fleet(testbed, tmp_path_factory) -> Path:
    """Step 1: the testbed's hosts written as fleet.yml entries by README's rehearsal commands
    (the testbed is the session's, already up; the file goes to the test's own directory)."""
    up, write, export = rehearsal_steps()
    assert up == "servefleet testbed up", up
    found = re.fullmatch(r"servefleet testbed fleet -o (\S+)", write)
    assert found and export == f"export SERVEFLEET_FLEET={found.group(1)}", (write, export)
    path = tmp_path_factory.mktemp("first-node") / "fleet.yml"
    done = bash(write.replace(found.group(1), str(path)), path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"export SERVEFLEET_FLEET={path}" in done.stderr
    return path


def rehearse(fleet: Path, host: str, engine: str, variant: tuple[str, str, str] | None = None):
    steps = readme_steps()
    assert steps[0] == "source .venv/bin/activate", steps[0]
    assert steps[1] == "$EDITOR inventory/fleet.yml", steps[1]  # step 1: the fixture's file
    ran = []
    for command in steps[2:]:
        if variant:
            inventory, deploy, skipped = variant
            if command.startswith(f"servefleet {skipped}"):
                continue
            command = command.replace("inventory/spark.py", inventory)
            command = command.replace("deploys/serve_bf16.py", deploy)
        word = command.split()[:2]
        if word == ["servefleet", "rollout"]:  # step 6: after a data change
            continue
        if word[0] == "pyinfra" and "--dry" not in command.split():
            done = bash(command, fleet, stdin="\n")  # step 4 asks: the user presses enter
            run = read_run(done.returncode, done.stdout + done.stderr)
            assert "Press enter to execute" in run.output, run.output[-3000:]
            assert run.returncode == 0 and run.errors == 0, run.output[-3000:]
            again = bash(command, fleet, stdin="\n")  # "a rerun changes nothing"
            rerun = read_run(again.returncode, again.stdout + again.stderr)
            assert rerun.returncode == 0 and rerun.operations > 0, rerun.output[-3000:]
            assert rerun.changed == 0, f"{command}: a rerun changed {rerun.changed} operations"
            print(f"[first-node] {command}: {run.changed} changed, then {rerun.changed}")
            ran.append(command)
            continue
        done = bash(command, fleet)
        out = done.stdout + done.stderr
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{out[-3000:]}"
        print(f"[first-node] {command}: exit 0\n{done.stdout[-1500:]}")
        if word == ["servefleet", "drift"]:  # "0 in sync"
            assert re.search(rf"^{re.escape(host)}: in_sync\b", done.stdout, re.M), out
        if word == ["servefleet", "status"]:  # "engine, model, service, /health"
            row = next(line for line in done.stdout.splitlines() if line.startswith(host))
            assert engine in row and re.search(r"\bactive\s+200$", row.rstrip()), done.stdout
        ran.append(command)
    assert [c.split()[:2] for c in ran][-2:] == [
        ["servefleet", "drift"],
        ["servefleet", "status"],
    ], ran
    return ran


def test_spark_first_node_steps_as_written(fleet):
    ran = rehearse(fleet, "spark-1", f"vllm {material.SPARK['vllm_version']}")
    assert any(c.startswith("servefleet plan-kv") for c in ran)
    assert any(c.startswith("pyinfra inventory/spark.py deploys/serve_bf16.py") for c in ran)


def test_rtx4090_first_node_steps_as_written(fleet):
    variant = rtx4090_variant()
    ran = rehearse(fleet, "rtx4090-1", f"llama.cpp {material.RTX4090['llamacpp_tag']}", variant)
    assert any(c.startswith(f"pyinfra {variant[0]} {variant[1]}") for c in ran)
    assert not any(c.startswith("servefleet plan-kv") for c in ran)
