"""bin/setup with an old Python first on the PATH (#30): it says which Python it found and what
it needs, takes an installed python3.X that is new enough, and makes a .venv of an old Python
again. Run on a copy of the script, with a PATH of shims only: fake Pythons that answer
`--version` and make fake venvs (whose pip logs what it is asked), the testbed's tools as no-ops,
and an apt-get that fails the test if it is called."""

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Host tools bin/setup looks for (then apt-get installs the missing ones): present as no-ops.
TOOLS = (
    "mmdebstrap systemd-nspawn slirp4netns ip iptables ssh rsync ccache cmake g++ make git qemu-aarch64-static chromium"
).split()
REAL = ("dirname", "rm", "mkdir", "chmod", "cat")  # what the script and the shims run


def fake_python(version: str, log: Path) -> str:
    """A Python that reports `version`, makes venvs of itself, and logs pip's arguments."""
    return f"""#!/bin/sh
case "$1" in
  --version) echo "Python {version}" ;;
  -c) exit 0 ;;
  -m)
    if [ "$2" = venv ]; then
      mkdir -p "$3/bin" && cat "$0" > "$3/bin/python" && chmod +x "$3/bin/python"
      echo "venv $3 Python {version}" >> {log}
    elif [ "$2" = pip ]; then
      shift 2; echo "pip {version} $*" >> {log}
    else
      echo "module $2 Python {version}" >> {log}  # e.g. the testbed's binfmt registration
    fi ;;
esac
"""


@pytest.fixture
def sandbox(tmp_path):
    """(repo copy, shims dir, log file, run) with bin/setup copied into the repo copy."""
    repo, shims, log = tmp_path / "repo", tmp_path / "shims", tmp_path / "log"
    (repo / "bin").mkdir(parents=True)
    shutil.copy(REPO / "bin" / "setup", repo / "bin" / "setup")
    shims.mkdir()
    log.write_text("")
    for tool in TOOLS:
        write(shims / tool, "#!/bin/sh\nexit 0\n")
    write(shims / "apt-get", f'#!/bin/sh\necho "apt-get $*" >> {log}\nexit 1\n')
    for tool in REAL:
        (shims / tool).symlink_to(shutil.which(tool))

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            ["/bin/bash", str(repo / "bin" / "setup")],
            env={"PATH": str(shims), "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    return repo, shims, log, run


def write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def venv_version(repo: Path) -> str:
    out = subprocess.run([str(repo / ".venv/bin/python"), "--version"], capture_output=True)
    return out.stdout.decode().strip()


def test_an_old_python3_is_named_a_newer_one_used_and_an_old_venv_made_again(sandbox):
    repo, shims, log, run = sandbox
    write(shims / "python3", fake_python("3.10.12", log))
    write(shims / "python3.12", fake_python("3.12.3", log))
    # What an earlier run with python3 3.10 left: a 3.10 .venv (was: kept, and setup failed on).
    (repo / ".venv/bin").mkdir(parents=True)
    write(repo / ".venv/bin/python", fake_python("3.10.12", log))
    done = run()
    assert done.returncode == 0, done.stderr
    said = done.stderr
    assert f"python3 is Python 3.10 ({shims}/python3); servefleet needs Python >= 3.11" in said
    assert f"using python3.12 ({shims}/python3.12, Python 3.12)" in said
    assert ".venv has Python 3.10" in said and "making it again with python3.12" in said
    assert venv_version(repo) == "Python 3.12.3"
    lines = log.read_text().splitlines()
    assert "apt-get" not in log.read_text(), lines
    assert "venv .venv Python 3.12.3" in lines and "pip 3.12.3 install -q -e .[test]" in lines


def test_no_python_new_enough_is_refused_with_what_it_found_and_what_it_needs(sandbox):
    repo, shims, log, run = sandbox
    write(shims / "python3", fake_python("3.10.12", log))
    done = run()
    assert done.returncode == 1
    assert "python3 is Python 3.10" in done.stderr and "needs Python >= 3.11" in done.stderr
    assert "no python3.11 or later is installed" in done.stderr
    assert not (repo / ".venv").exists() and log.read_text() == ""


def test_a_python3_new_enough_is_used_and_a_good_venv_kept(sandbox):
    repo, shims, log, run = sandbox
    write(shims / "python3", fake_python("3.11.2", log))
    (repo / ".venv/bin").mkdir(parents=True)
    write(repo / ".venv/bin/python", fake_python("3.12.3", log))  # made by a python3.12 once
    done = run()
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert venv_version(repo) == "Python 3.12.3"
    assert log.read_text().splitlines() == [
        "pip 3.12.3 install -q --upgrade pip",
        "pip 3.12.3 install -q -e .[test]",
        "module servefleet_dev.testbed.binfmt Python 3.12.3",  # by the kept venv's Python
    ]
