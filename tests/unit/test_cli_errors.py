"""The real `servefleet` command on bad input and unreachable hosts: one line saying why (which
file or host, what was expected) and the exit code of the table (servefleet/core/errors.py):
2 refused before any host was touched, 3 a host could not be reached. No VM needed: an
unreachable host is 127.0.0.1 on a closed port."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNREACHABLE = "hosts:\n  - {name: spark-01, role: spark, ssh_hostname: 127.0.0.1, ssh_port: 1}\n"
REASON = "Unable to connect to port 1 on 127.0.0.1"


@pytest.fixture
def fleet(tmp_path):
    """A fleet file written for one test; returns its path."""

    def write(text: str = UNREACHABLE) -> Path:
        path = tmp_path / "fleet.yml"
        path.write_text(text)
        return path

    return write


def servefleet(
    *args: str, fleet: Path | None = None, cwd: Path = REPO, stdin: str = ""
) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    env.pop("SERVEFLEET_FLEET", None)
    if fleet is not None:
        env["SERVEFLEET_FLEET"] = str(fleet)
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli", *args],
        cwd=cwd,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
    )


def one_line(proc: subprocess.CompletedProcess, command: str) -> str:
    """The refusal: exactly one line on stderr, prefixed with the command."""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"servefleet {command}: "), lines[0]
    return lines[0]


# --- 2: refused before any host is touched ------------------------------------------------------


@pytest.mark.parametrize(
    "command,args",
    [
        ("drift", ["inventory/sprak.py", "deploys/base.py"]),
        ("status", ["inventory/sprak.py"]),
        ("bench", ["inventory/sprak.py"]),
        ("rollout", ["inventory/sprak.py", "deploys/serve_bf16.py"]),
        ("rollback", ["inventory/sprak.py", "--limit", "spark-01"]),
        ("rebuild", ["inventory/sprak.py", "deploys/base.py", "--limit", "spark-01", "--yes"]),
    ],
)
def test_a_typo_in_the_inventory_path_is_one_line_and_exit_2(fleet, command, args):
    # Was: pyinfra took the name for a host or module, found no host, and drift / status
    # exited 3 with an empty report, bench 1 with an empty table.
    proc = servefleet(command, *args, fleet=fleet())
    line = one_line(proc, command)
    assert "inventory file inventory/sprak.py: not found in" in line
    assert line.endswith("did you mean inventory/spark.py?")
    assert proc.returncode == 2 and proc.stdout == ""


def test_a_typo_in_the_deploy_path_is_one_line_and_exit_2(fleet):
    proc = servefleet("drift", "inventory/spark.py", "deploys/bsae.py", fleet=fleet())
    line = one_line(proc, "drift")
    assert "deploy file deploys/bsae.py: not found in" in line
    assert line.endswith("did you mean deploys/base.py?")
    assert proc.returncode == 2


@pytest.mark.parametrize(
    "path,expected",
    [
        ("inventory/fleet.yml", "expected a Python inventory such as inventory/fleet.py"),
        ("deploys/base.py", "could not be loaded"),  # arguments swapped: a deploy as inventory
    ],
)
def test_a_file_that_is_no_inventory_is_one_line_not_a_traceback(fleet, path, expected):
    proc = servefleet("status", path, fleet=fleet())
    line = one_line(proc, "status")
    assert f"inventory file {path}: " in line and expected in line
    assert proc.returncode == 2


# Every fleet verb, with what it needs besides --limit.
EVERY_VERB = [
    ("drift", ["inventory/spark.py", "deploys/base.py"]),
    ("status", ["inventory/spark.py"]),
    ("bench", ["inventory/spark.py"]),
    ("rollout", ["inventory/spark.py", "deploys/serve_bf16.py"]),
    ("rollback", ["inventory/spark.py"]),
    ("rebuild", ["inventory/spark.py", "deploys/base.py", "--yes"]),
]


@pytest.mark.parametrize("command,args", EVERY_VERB)
def test_a_limit_that_matches_no_host_is_one_line_and_exit_2(fleet, command, args):
    proc = servefleet(command, *args, "--limit", "sprak-01", fleet=fleet())
    line = one_line(proc, command)
    assert line.endswith(
        "--limit sprak-01 matches no host of inventory/spark.py (hosts: spark-01; groups: spark, vllm)"
    )
    assert proc.returncode == 2


@pytest.mark.parametrize(
    "text",
    [
        "hosts: []\n",
        "hosts:\n  - {name: gpu-01, role: rtx4090, ssh_hostname: 127.0.0.1, ssh_port: 1}\n",
    ],
)
@pytest.mark.parametrize("command,args", EVERY_VERB)
def test_an_empty_fleet_is_one_line_and_exit_2(fleet, text, command, args):
    path = fleet(text)
    limit = ["--limit", "spark-01"] if command in ("rollback", "rebuild") else []
    proc = servefleet(command, *args, *limit, fleet=path)
    line = one_line(proc, command)
    assert f"inventory inventory/spark.py has no hosts: {path} lists no node for it" in line
    assert line.endswith("add one entry per node (see docs/nodes.md)")
    assert proc.returncode == 2


def test_a_missing_fleet_file_says_where_to_read_how_to_write_one(tmp_path):
    path = tmp_path / "fleet.yml"
    proc = servefleet("status", "inventory/spark.py", fleet=path)
    line = one_line(proc, "status")
    assert line.endswith(f"{path}: not found (write one entry per node; see docs/nodes.md)")
    assert proc.returncode == 2


@pytest.mark.parametrize("args", [[], ["--markdown"]])
def test_knobs_outside_the_repository_says_where_to_run_it(tmp_path, args):
    proc = servefleet("knobs", *args, cwd=tmp_path)
    line = one_line(proc, "knobs")
    assert f"no group_data/all.py in {tmp_path}: run from the repository root" in line
    assert proc.returncode == 2 and proc.stdout == ""


def test_knobs_from_the_repository_lists_the_data():
    proc = servefleet("knobs")
    assert proc.returncode == 0, proc.stderr
    assert "Shared by every host (group_data/all.py):" in proc.stdout


def test_a_refused_rebuild_json_still_prints_one_json_object(fleet):
    proc = servefleet(
        "rebuild",
        "inventory/sprak.py",
        "deploys/base.py",
        "--limit",
        "spark-01",
        "--yes",
        "--json",
        fleet=fleet(),
    )
    report = json.loads(proc.stdout)
    assert report["refused"] is True and report["ok"] is False and report["exit_code"] == 2
    assert "inventory/sprak.py: not found" in report["message"] == report["error"]
    assert "did you mean inventory/spark.py?" in one_line(proc, "rebuild")
    assert proc.returncode == 2


# --- 3: a host that cannot be reached -----------------------------------------------------------


def test_drift_of_an_unreachable_host_is_exit_3_with_the_whole_reason(fleet):
    proc = servefleet("drift", "inventory/spark.py", "deploys/base.py", fleet=fleet())
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "spark-01: unchecked"
    assert all(len(line) <= 80 for line in lines), proc.stdout
    assert "…" not in proc.stdout  # was: "Could not connect ([Errno None] Unable to connect…"
    assert REASON in " ".join(line.strip() for line in lines)
    assert lines[-1] == "drift: 1 hosts: 0 in sync, 0 drifted, 1 unchecked (exit 3)"


def test_drift_json_of_an_unreachable_host_is_exit_3(fleet):
    proc = servefleet("drift", "inventory/spark.py", "deploys/base.py", "--json", fleet=fleet())
    report = json.loads(proc.stdout)
    assert proc.returncode == 3 and report["exit_code"] == 3
    assert report["hosts"]["spark-01"]["status"] == "unchecked"
    assert REASON in report["hosts"]["spark-01"]["error"]


def test_status_of_an_unreachable_host_is_exit_3_with_the_whole_reason(fleet):
    proc = servefleet("status", "inventory/spark.py", fleet=fleet())
    assert proc.returncode == 3, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), proc.stdout
    assert "…" not in proc.stdout  # was: "error: Could not connect ([Er…"
    row = next(line for line in lines[1:] if line.startswith("spark-01 "))
    assert row.split()[:3] == ["spark-01", "spark", "not"]  # its role, and "not read (below)"
    below = " ".join(line.strip() for line in lines[lines.index(row) + 1 :])
    assert below.startswith("spark-01: not read: Could not connect") and REASON in below


def test_rebuild_of_an_unreachable_host_is_exit_3_and_changes_nothing(fleet):
    proc = servefleet(
        "rebuild",
        "inventory/spark.py",
        "deploys/base.py",
        "--limit",
        "spark-01",
        "--yes",
        fleet=fleet(),
    )
    line = one_line(proc, "rebuild")
    assert line.startswith("servefleet rebuild: cannot reach spark-01 (Could not connect")
    assert REASON in line and line.endswith("; nothing was changed")
    assert proc.returncode == 3 and proc.stdout == ""


def test_a_refused_rebuild_json_of_an_unreachable_host_is_a_json_object(fleet):
    # Was: nothing on stdout. Not asked either: the host is refused before the question.
    proc = servefleet(
        "rebuild",
        "inventory/spark.py",
        "deploys/base.py",
        "--limit",
        "spark-01",
        "--json",
        fleet=fleet(),
    )
    report = json.loads(proc.stdout)
    assert report["hosts"] == {"spark-01": {"teardown": None, "converge": None, "ok": False}}
    assert report["refused"] is True and report["summary"] == {
        "hosts": 1,
        "rebuilt": 0,
        "not_rebuilt": 1,
    }
    assert report["exit_code"] == 3 and REASON in report["message"] == report["error"]
    assert proc.returncode == 3


@pytest.mark.parametrize("compare", [[], ["--compare"]])
def test_bench_of_an_unreachable_host_is_exit_3_with_the_whole_reason(fleet, compare):
    # Was: exit 1, and the reason cut in the table.
    proc = servefleet("bench", "inventory/spark.py", *compare, fleet=fleet())
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), proc.stdout
    row = next(line for line in lines if line.startswith("spark-01 "))
    assert "not reached" in row
    below = " ".join(line.strip() for line in lines[lines.index(row) + 1 :])
    assert below.startswith("spark-01: not reached: Could not connect") and REASON in below


@pytest.mark.parametrize(
    "command,args",
    [
        ("rollback", ["inventory/spark.py", "--limit", "spark-01"]),
        ("rollout", ["inventory/spark.py", "deploys/serve_bf16.py"]),
    ],
)
def test_rollout_and_rollback_of_an_unreachable_host_are_exit_3_and_change_nothing(
    fleet, command, args
):
    # Was (rollback): exit 4, "needs attention", the reason cut.
    proc = servefleet(command, *args, fleet=fleet())
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), proc.stdout
    said = " ".join(line.strip() for line in lines[:-1])
    assert said.startswith("cannot reach spark-01 (Could not connect") and REASON in said
    assert said.endswith("nothing was changed") and lines[-1].endswith("exit 3")
    report = json.loads(servefleet(command, *args, "--json", fleet=fleet()).stdout)
    assert report["exit_code"] == 3 and report["hosts"] == {} and REASON in report["message"]


# --- --json: one shape for every fleet verb -----------------------------------------------------


@pytest.mark.parametrize("command,args", EVERY_VERB)
def test_every_fleet_verbs_json_is_an_object_of_hosts_summary_and_exit_code(fleet, command, args):
    # Was: status and bench printed a list, rebuild a list of names under "hosts", rollout and
    # rollback no summary.
    limit = ["--limit", "spark-01"]
    proc = servefleet(command, *args, *limit, "--json", fleet=fleet())
    doc = json.loads(proc.stdout)
    assert isinstance(doc, dict) and {"hosts", "summary", "exit_code", "error"} <= set(doc)
    assert doc["exit_code"] == proc.returncode == 3, proc.stdout + proc.stderr
    assert isinstance(doc["hosts"], dict) and isinstance(doc["summary"], dict)
    assert doc["summary"]["hosts"] == len(doc["hosts"])
    assert list(doc["hosts"]) in (["spark-01"], [])  # rollout and rollback: refused, no host
    if doc["error"] is None:  # a verb that reports the host it could not reach, and goes on
        assert list(doc["hosts"]) == ["spark-01"]
    else:  # a verb that refuses to start without every host: the reason is the error
        assert REASON in doc["error"]


# --- from another directory: the inventory's own project, or "run from the repository root" -----


def test_a_verb_from_another_directory_reads_the_inventorys_project(fleet, tmp_path):
    # Was: "inventory/fleet.yml: not found" (the file exists), or with $SERVEFLEET_FLEET set,
    # every host refused for keys group_data/ sets (the data was not found, not wrong).
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fleet()
    proc = servefleet(
        "status", str(REPO / "inventory" / "spark.py"), fleet=Path("../fleet.yml"), cwd=elsewhere
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert proc.stdout.startswith("host ") and REASON in " ".join(proc.stdout.split())


def test_a_deploy_named_as_from_the_project_is_found_from_another_directory(fleet, tmp_path):
    proc = servefleet(
        "drift",
        str(REPO / "inventory" / "spark.py"),
        "deploys/base.py",
        "--json",
        fleet=fleet(),
        cwd=tmp_path,
    )
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["deploy"] == "deploys/base.py", proc.stderr
    assert doc["inventory"] == "inventory/spark.py"


@pytest.mark.parametrize("inventory", ["inventory/spark.py", "inventory/testbed.py"])
def test_pyinfra_from_another_directory_says_run_from_the_repository_root(tmp_path, inventory):
    # pyinfra reads group_data/ and files/ from the current directory: that cannot change, so
    # the run is refused, in one line, before anything connects.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SERVEFLEET_FLEET", None)
    proc = subprocess.run(
        [
            str(Path(sys.executable).with_name("pyinfra")),
            "-y",
            str(REPO / inventory),
            str(REPO / "deploys" / "base.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "servefleet:" in line]
    assert len(said) == 1 and said[0].endswith(
        "run from the repository root"
        + (f" (cd {REPO})" if inventory == "inventory/spark.py" else "")
    ), said
    assert "Traceback" not in proc.stderr
