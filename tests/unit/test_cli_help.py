"""Every operator command explains itself at 80 columns: what it does and how it exits; and the
conventions of a command line: --version, the bare command, `help VERB`, --json refusals, a
closed pipe."""

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from servefleet.cli import COMMANDS, FLEET_VERBS, build_parser

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def parser(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")  # argparse wraps to the terminal's width
    return build_parser()


def test_top_level_help_names_pyinfra_the_repository_root_and_the_exit_codes(parser):
    text = parser.format_help()
    assert "pyinfra inventory/<role>.py deploys/<recipe>.py" in text
    assert "repository root" in text and "exit codes:" in text
    assert "test tooling: demo, hub, testbed" in text
    assert max(len(line) for line in text.splitlines()) <= 80, text


def command_parser(parser, name: str):
    return next(a for a in parser._actions if a.dest == "command").choices[name]


@pytest.mark.parametrize("command", FLEET_VERBS)
def test_each_fleet_verb_says_what_it_does_and_how_it_exits(parser, command):
    sub = command_parser(parser, command)
    text = sub.format_help()
    assert sub.description and " ".join(sub.description.split()) in " ".join(text.split())
    assert "exit codes:" in text and "  3   a host could not be reached" in text
    assert max(len(line) for line in text.splitlines()) <= 80, text


@pytest.mark.parametrize("command", [c.replace("_", "-") for c in COMMANDS])
def test_every_command_has_a_description(parser, command):
    assert command_parser(parser, command).description


# --- the conventions a command line is expected to keep (#30) ----------------------------------


def servefleet(*args: str, cwd: Path = REPO, **kw) -> subprocess.CompletedProcess:
    """The real command, as installed (the entry point's main())."""
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from servefleet.cli import main; sys.exit(main())",
            *args,
        ],
        cwd=cwd,
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=120,
        **kw,
    )


def test_version_is_the_package_version():
    proc = servefleet("--version")
    assert proc.returncode == 0 and proc.stdout == f"servefleet {version('servefleet')}\n"


def test_servefleet_alone_prints_the_help_as_a_usage_error():
    # argparse's convention for a missing argument: the help on stderr, exit 2 (stdout stays
    # clean for a script); `servefleet --help` prints the same on stdout, exit 0.
    proc = servefleet()
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == servefleet("--help").stdout
    assert "operator commands" in proc.stderr and "exit codes:" in proc.stderr


@pytest.mark.parametrize("command", [*FLEET_VERBS, "plan-kv", "knobs"])
def test_help_verb_prints_the_verbs_help(command):
    proc = servefleet("help", command)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == servefleet(command, "--help").stdout
    assert proc.stdout.startswith(f"usage: servefleet {command} ")


def test_help_alone_and_help_of_a_testbed_action():
    assert servefleet("help").stdout == servefleet("--help").stdout
    proc = servefleet("help", "testbed", "up")
    assert proc.returncode == 0 and proc.stdout.startswith("usage: servefleet testbed up ")


def test_help_of_a_command_that_does_not_exist_is_one_line_and_exit_2():
    proc = servefleet("help", "sattus")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "servefleet help: servefleet has no command 'sattus'; did you mean status?\n"
    )


# --json: a refusal is still one JSON object on stdout, with the message and the exit code.
REFUSED = [
    ("drift", ["inventory/sprak.py", "deploys/base.py"]),
    ("status", ["inventory/sprak.py"]),
    ("bench", ["inventory/sprak.py"]),
    ("rollout", ["inventory/sprak.py", "deploys/serve_bf16.py"]),
    ("rollback", ["inventory/sprak.py", "--limit", "spark-01"]),
    ("rebuild", ["inventory/sprak.py", "deploys/base.py", "--limit", "spark-01", "--yes"]),
    ("report", ["inventory/sprak.py"]),
]


@pytest.mark.parametrize("command,args", REFUSED)
def test_a_refusal_under_json_is_a_json_error_object(command, args):
    proc = servefleet(command, *args, "--json")
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stdout)
    assert {"hosts", "summary", "exit_code", "error"} <= set(doc)
    assert doc["hosts"] == {} and doc["summary"]["hosts"] == 0 and doc["exit_code"] == 2
    assert "inventory file inventory/sprak.py: not found" in doc["error"]
    assert "did you mean inventory/spark.py?" in proc.stderr  # the one line, as without --json


@pytest.mark.parametrize(
    "args,said",
    [
        (["status", "--json"], "the following arguments are required: inventory"),
        (["drift", "inventory/spark.py", "--json"], "required: deploy"),
        (["rollout", "inventory/spark.py", "deploys/base.py", "--batch"], None),
        (["bench", "inventory/spark.py", "--runs", "many", "--json"], "invalid int value"),
    ],
)
def test_bad_arguments_under_json_are_a_json_error_object(args, said):
    proc = servefleet(*args)
    assert proc.returncode == 2 and "usage: servefleet" in proc.stderr
    if said is None:  # no --json: argparse's usage and error, nothing on stdout
        assert proc.stdout == ""
        return
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 2 and said in doc["error"] and doc["hosts"] == {}


def test_plan_kv_refusal_under_json_is_a_json_error_object(tmp_path):
    proc = servefleet(
        "plan-kv",
        "--config",
        str(tmp_path / "nope.json"),
        "--max-model-len",
        "4096",
        "--kv-cache-memory-bytes",
        "8GiB",
        "--json",
    )
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 2 and "nope.json" in doc["error"]


# --- output into a closed pipe (`servefleet knobs | head -1`) -----------------------------------


@pytest.mark.parametrize("args", [["knobs"], ["knobs", "--markdown"], ["--help"]])
def test_output_into_a_closed_pipe_exits_141_without_a_traceback(args):
    # The reader is gone before the first byte: every write fails (deterministically; `head
    # -1` leaves only after its line). Was: a BrokenPipeError traceback, exit 1 or 120.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from servefleet.cli import main; sys.exit(main())",
            *args,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "COLUMNS": "80"},
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err  # 128 + SIGPIPE, as `yes | head -1`'s yes
    assert err == "", err


def test_a_shell_pipe_into_head_is_quiet():
    done = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m servefleet.cli knobs | head -1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout == "Shared by every host (group_data/all.py):\n"
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert done.returncode in (0, 141)  # 0 when all of it fitted in the pipe before head left


def test_a_command_imports_itself_and_none_of_the_others():
    """`servefleet status` runs without importing rollout's, report's or the demo's modules (the
    operator's CLI runs once per fleet action: every other command's imports doubled its start);
    `servefleet --help` and a command no one has still know every command."""
    probe = (
        "import sys\n"
        "from servefleet.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(sorted(m for m in sys.modules if m.startswith(('servefleet.cli.', "
        "'servefleet_dev.cli.', 'servefleet.engines.vllm.cli'))), file=sys.stderr)\n"
        "raise SystemExit(code)\n"
    )

    def run(*args: str) -> tuple[int, str, str]:
        out = subprocess.run(
            [sys.executable, "-c", probe, *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "80"},
        )
        return out.returncode, out.stdout, out.stderr.strip().splitlines()[-1]

    code, _, loaded = run("status", "inventory/none.py")
    assert code == 2  # no such inventory: refused, one line (nothing connects)
    assert "'servefleet.cli.status'" in loaded
    for other in ("rollout", "report", "rebuild", "bench", "drift"):
        assert f"'servefleet.cli.{other}'" not in loaded, loaded
    assert "servefleet_dev.cli.demo" not in loaded and "plan_kv" not in loaded, loaded
    code, help_text, _ = run("--help")
    assert code == 0
    for name in (*COMMANDS, "plan-kv", "demo", "testbed", "hub"):
        assert f"    {name} " in help_text, (name, help_text)
    code, _, _ = run("statuss")
    assert code == 2
