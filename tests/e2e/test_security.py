"""Safe on a real fleet, checked on the testbed's nodes (reached as a sudo user):

- the service user can change nothing that root runs: under the node root, nothing outside the
  declared writable directories is owned by it or writable for it, and every executable root
  runs in a converge, a drift check or a status is outside them and root's;
- the API key is in no command pyinfra runs (its debug log), in no process's command line on
  the node during the health check and smoke test, not in `--diff`, and its files are 0600 from
  the first byte, also when written through sudo;
- both units are hardened: `systemd-analyze security` scores them <= 2.5.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

import pytest
import yaml

from servefleet_dev.testbed import hosts as tb_hosts, material
from servefleet_dev.testbed.state import load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra

pytestmark = pytest.mark.e2e
ROOT = "/opt/servefleet"
WRITABLE = (f"{ROOT}/cache", f"{ROOT}/models")
NODES = {"spark-1": "deploys/serve_bf16.py", "rtx4090-1": "deploys/serve_q4_llamacpp.py"}
KEY = "sk-security-" + "7f3a9c21e8b4"


@pytest.fixture(scope="module")
def served(testbed):
    material.prepare()
    for host, deploy in NODES.items():
        run = pyinfra("inventory/testbed.py", deploy, limit=host, timeout=3600)
        assert run.returncode == 0, run.output[-3000:]
    return testbed


@pytest.mark.parametrize("host", list(NODES))
def test_nothing_root_runs_is_the_service_users(served, th, host):
    h = th(host)
    prune = " ".join(f"-path {d} -prune -o" for d in WRITABLE)
    # Owned by the service user, or writable by its group or by anyone, outside its dirs.
    found = h.check_output(
        f"find {ROOT} -xdev {prune} \\( -user servefleet -o -group servefleet "
        f"-perm -g+w -o -perm -o+w \\) ! -type l -print"
    )
    assert found == "", found
    for d in WRITABLE:  # the declared writable dirs are the service's, and nothing above them
        assert h.file(d).user == "servefleet"
    # Every executable root runs: root-owned, not writable by others, outside the writable dirs.
    executables = h.check_output(
        f"ls -d {ROOT}/bin/* {ROOT}/tools/venv/bin/python* {ROOT}/tools/venv/bin/uv "
        f"{ROOT}/venvs/*/bin/python* 2>/dev/null || true"
    ).split()
    if host == "spark-1":
        executables.append(material.SPARK["vllm_executable"])
    assert executables
    for path in executables:
        real = h.check_output(f"readlink -f {path}")
        assert not real.startswith(WRITABLE), real
        stat = h.check_output(f"stat -c '%U %a' {real}").split()
        assert stat[0] == "root" and int(stat[1][-2]) & 2 == 0 and int(stat[1][-1]) & 2 == 0, (
            real,
            stat,
        )
    # Tried as the service user: root's venv cannot be swapped.
    denied = h.run(f"runuser -u servefleet -- sh -c 'echo x > {ROOT}/tools/venv/bin/evil'")
    assert denied.rc != 0 and not h.file(f"{ROOT}/tools/venv/bin/evil").exists


# A watch loop on a node ends with the ssh session that started it ($PPID is that session's
# sshd; a loop that prints nothing never learns of the disconnect from a broken pipe), and
# after 15 minutes whatever happens.
UNTIL_DISCONNECT = (
    "sf_watch=1; end=$(( $(date +%s) + 900 )); while kill -0 $PPID 2>/dev/null && "
    "[ $(date +%s) -lt $end ]; do"
)


def stop_remote(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=10)


class Sampler:
    """Every process's command line on a node, sampled in a loop while a converge runs."""

    def __init__(self, host: str):
        rec = load_state().hosts[host]
        loop = (
            f"{UNTIL_DISCONNECT} cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; "
            "echo; sleep 0.05; done"
        )
        self.proc = subprocess.Popen(
            [*tb_hosts.ssh_args(rec), loop],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def stop(self) -> str:
        stop_remote(self.proc)
        self.thread.join(timeout=10)
        return "".join(self.lines)


class ModeWatch:
    """Modes and sizes of the key files (and servefleet's upload staging) as they appear."""

    def __init__(self, host: str):
        rec = load_state().hosts[host]
        loop = (
            f"{UNTIL_DISCONNECT} stat -c '%a %s %U %n' {ROOT}/etc/api-key* "
            f"{ROOT}/etc/vllm.env* /tmp/servefleet-upload.*/content /tmp/pyinfra-* "
            "2>/dev/null; done"
        )
        self.proc = subprocess.Popen(
            [*tb_hosts.ssh_args(rec), loop],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self.thread = threading.Thread(
            target=lambda: self.lines.extend(self.proc.stdout), daemon=True
        )
        self.thread.start()

    def stop(self) -> list[str]:
        stop_remote(self.proc)
        self.thread.join(timeout=10)
        return self.lines


@pytest.mark.parametrize("host", list(NODES))
def test_the_api_key_stays_out_of_argv_logs_diff_and_other_eyes(served, th, host, tmp_path):
    key = tmp_path / "api-key"
    key.write_text(KEY + "\n")
    h = th(host)
    h.run(f"rm -f {ROOT}/etc/api-key {ROOT}/etc/vllm.env")
    sampler, watch = Sampler(host), ModeWatch(host)
    time.sleep(1)
    try:
        # --debug: pyinfra logs every command it runs; --diff: what it would print of files.
        run = pyinfra(
            "inventory/testbed.py",
            NODES[host],
            "--debug",
            "--diff",
            limit=host,
            data={"api_key_file": str(key)},
            timeout=1800,
        )
    finally:
        seen = sampler.stop()
        modes = watch.stop()
    # The watch loops end with their ssh sessions: nothing of them spins on the node afterwards.
    deadline = time.monotonic() + 10
    while h.run("pgrep -f 'sf_watch[=]1'").rc == 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert h.run("pgrep -f 'sf_watch[=]1'").rc != 0, h.run("pgrep -af 'sf_watch[=]1'").stdout
    assert run.returncode == 0, run.output[-3000:]
    assert KEY not in run.output  # no command, no diff, no log line holds it
    assert seen.count("servefleet-health") > 0, "the sampler missed the health check"
    assert KEY not in seen  # no process's command line on the node
    assert seen and len(seen.splitlines()) > 20
    # 0600 (root) from the first byte: no observed moment where a key file held bytes while
    # readable by others; the staging file lives in a 0700 directory of the login user.
    for line in modes:
        mode, size, owner, name = line.split(maxsplit=3)
        if int(size) > 0 and "servefleet-upload" not in name:
            assert mode == "600" and owner == "root", line
        if "/tmp/pyinfra-" in name:
            assert KEY not in h.run(f"cat {name} 2>/dev/null").stdout
    staged = [line for line in modes if "servefleet-upload" in line]
    for line in staged:
        assert line.split()[0] in ("600", "644", "400"), line  # inside a 0700 directory
    back = pyinfra("inventory/testbed.py", NODES[host], limit=host, timeout=1800)
    assert back.returncode == 0, back.output[-3000:]


@pytest.mark.parametrize(
    "host,unit", [("spark-1", "servefleet-vllm.service"), ("rtx4090-1", "servefleet-llama.service")]
)
def test_units_are_hardened(served, th, host, unit):
    out = th(host).check_output(f"systemd-analyze security {unit} --no-pager")
    score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out).group(1))
    print(f"[security] {unit} on {host}: exposure {score}")
    assert score <= 2.5, out[-2000:]
    assert th(host).service(unit).is_running  # and it still serves, hardened


@pytest.mark.parametrize(
    "host,unit", [("spark-1", "servefleet-vllm.service"), ("rtx4090-1", "servefleet-llama.service")]
)
def test_the_engine_cannot_read_the_fetchers_secrets(served, th, host, unit):
    """The hub token and the depot key are the model fetcher's: 0400, owned by the service user,
    which the engine runs as too. From inside the running engine's own sandbox (its mount
    namespace, its uid and gid) neither can be read, nor root's records; the same user outside
    that sandbox reads the secrets, so it is the unit that hides them, not a mode."""
    h = th(host)
    pid = h.check_output(f"systemctl show -P MainPID {unit}").strip()
    assert pid.isdigit() and pid != "0", pid
    uid, gid = h.check_output(f"stat -c '%u %g' /proc/{pid}").split()
    assert h.check_output("id -u servefleet").strip() == uid
    planted = []
    for name in ("hf-token", "depot-key"):
        path = f"{ROOT}/etc/{name}"
        if not h.file(path).exists:  # as the recipes write them (etc/ is made, the files not)
            h.run_test(
                f"install -m 400 -o servefleet -g servefleet /dev/null {path} && "
                f"echo canary-{name} > {path}"
            )
            planted.append(path)
    inside = f"nsenter -t {pid} -m -S {uid} -G {gid} --"
    try:
        for path in (
            f"{ROOT}/etc/hf-token",
            f"{ROOT}/etc/depot-key",
            f"{ROOT}/state/releases.json",
        ):
            got = h.run(f"{inside} cat {path}")
            assert got.rc != 0 and "Permission denied" in got.stderr, (path, got.stdout[:80])
        for path in (f"{ROOT}/etc/hf-token", f"{ROOT}/etc/depot-key"):
            assert h.run(f"runuser -u servefleet -- cat {path}").rc == 0, path
        # ...and the engine still reads what it serves from: its models and its cache.
        assert h.run(f"{inside} ls {ROOT}/models {ROOT}/cache").rc == 0
    finally:
        for path in planted:
            h.run(f"rm -f {path}")


def test_a_service_user_that_is_not_servefleets_is_refused_before_anything_changes(served, th):
    """servefleet_user naming a group the node has (video: GPU access; systemd-journal: every
    log; staff: /usr/local) or an account of someone else: the preflight refuses it in one
    line, and the node is as it was: no account made or changed, no file, no unit."""
    host = "rtx4090-1"
    h = th(host)
    h.run("getent passwd pgsim >/dev/null || useradd --system --no-create-home pgsim")
    try:
        accounts = h.check_output("sha256sum /etc/passwd /etc/group /etc/shadow")
        before = node_snapshot(h)
        for name, what in (
            ("video", "a group 'video'"),
            ("systemd-journal", "a group"),
            ("staff", "a group 'staff'"),
            ("pgsim", "an account 'pgsim'"),
        ):
            assert h.run(f"getent group {name}").rc == 0, name  # it exists on the node
            run = pyinfra(
                "inventory/testbed.py",
                NODES[host],
                limit=host,
                data={"servefleet_user": name},
                timeout=600,
            )
            assert run.returncode != 0, run.output[-2000:]
            assert f"key 'servefleet_user' = {name!r}: {what}" in run.output, run.output[-2000:]
            assert "is not servefleet's" in run.output and "Traceback" not in run.output
        assert h.check_output("sha256sum /etc/passwd /etc/group /etc/shadow") == accounts
        assert node_snapshot(h) == before
    finally:
        h.run("userdel pgsim")


def test_directories_that_are_not_servefleets_are_refused_on_the_node(served, th):
    """#27 rule 2, the node side: data that passes the exact shapes is still refused when the
    node says the place is someone else's: a directory that exists without root's mark (as
    /var/lib/docker would), one under a world-writable /scratch, one whose mark the service
    user forged. One line each, before anything is made or changed; rebuild deletes nothing
    there either. The converged root carries root's mark, and a root converged before marks
    existed is adopted once (the second converge changes nothing)."""
    host = "rtx4090-1"
    h = th(host)
    taken, scratch, forged = "/opt/servefleet-taken", "/scratch", "/data/servefleet-forged"
    h.run_test(
        f"rm -rf {taken} {scratch} {forged} && install -d -m 700 {taken} && "
        f"echo theirs > {taken}/volume && install -d -m 1777 {scratch} && "
        f"install -d -o servefleet -g servefleet -m 755 {forged} && runuser -u "
        f"servefleet -- touch {forged}/.servefleet-own"
    )
    try:
        around = f"find {taken} {scratch} {forged} -printf '%p %u %m %s %T@\\n' | sort"
        before, places = node_snapshot(h), h.check_output(around)
        for knob, expected in (
            (
                {"servefleet_root": taken},
                f"key 'servefleet_root' = '{taken}': {taken} "
                "exists on this node and is not servefleet's",
            ),
            (
                {"servefleet_root": f"{scratch}/servefleet"},
                f"{scratch} above it is owned by root (uid 0), mode 1777",
            ),
            (
                {"models_root": forged},
                "its .servefleet-own is a regular empty file owned by servefleet",
            ),
        ):
            for deploy in (NODES[host], "deploys/teardown.py"):
                run = pyinfra("inventory/testbed.py", deploy, limit=host, data=knob, timeout=600)
                assert run.returncode != 0, (knob, deploy, run.output[-2000:])
                assert expected in run.output, (knob, deploy, run.output[-2000:])
                assert "Traceback" not in run.output
        assert h.check_output(around) == places
        assert node_snapshot(h) == before
    finally:
        h.run(f"rm -rf {taken} {scratch} {forged}")
    mark = h.file(f"{ROOT}/.servefleet-own")
    assert (mark.is_file, mark.user, mark.mode) == (True, "root", 0o644)
    h.run_test(f"rm {ROOT}/.servefleet-own")  # as a root converged by the version before
    assert pyinfra("inventory/testbed.py", NODES[host], limit=host).returncode == 0
    assert h.file(f"{ROOT}/.servefleet-own").user == "root"
    assert pyinfra("inventory/testbed.py", NODES[host], limit=host).changed == 0


def test_host_key_checking_off_is_warned_loudly(served, fleet_file, tmp_path):
    path = fleet_file({"depot-1": ("depot", {})})
    fleet = yaml.safe_load(open(path))
    fleet["hosts"][0]["ssh_strict_host_key_checking"] = "no"
    open(path, "w").write(yaml.safe_dump(fleet))
    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory/depot.py", "deploys/base.py"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "SERVEFLEET_FLEET": path},
        timeout=600,
    )
    out = run.stdout + run.stderr
    assert out.count("WARNING: SSH host-key checking is OFF for depot-1") == 1


# --- hostile input on a real node ---------------------------------------------------------------

# Path knobs that would hand root's tree or system directories to the service user, or make
# root consume or delete what others write (issue #18, classes 1-3): refused before a
# connection, for both recipes.
HOSTILE_PATHS = [
    {"models_root": f"{ROOT}/bin"},
    {"models_root": "/etc/systemd/system"},
    {"depot_store": f"{ROOT}/venvs"},
    {"servefleet_root": "/proc/1/root"},
    {"servefleet_root": "/tmp/servefleet"},
    {"uv_cache_dir": f"{ROOT}/cache/uv"},
    {"llamacpp_ccache_dir": "/dev/shm/ccache"},
]


def node_snapshot(h) -> str:
    """Every path, owner, mode, size and mtime under the node root and the unit directory."""
    return h.check_output(
        f"find {ROOT} /etc/systemd/system -xdev -printf '%p %u %m %s %T@\\n' | sort"
    )


@pytest.mark.parametrize("host", list(NODES))
def test_hostile_path_knobs_leave_the_node_unchanged(served, th, host):
    h = th(host)
    before = node_snapshot(h)
    for knob in HOSTILE_PATHS:
        run = pyinfra("inventory/testbed.py", NODES[host], limit=host, data=knob, timeout=600)
        key = next(iter(knob))
        assert run.returncode == 2, (knob, run.output[-2000:])
        assert key in run.output and "nothing was changed" in run.output, run.output[-2000:]
        assert "Traceback" not in run.output
    assert node_snapshot(h) == before


SPARK_MODEL = f"{ROOT}/models/Qwen--Qwen-AgentWorld-35B-A3B"


def test_a_hostile_models_root_is_never_followed_by_root(served, th):
    """The engine (the service user) plants links into root's world, a FIFO, a loop, an extra
    shard and a forged record in the model directory. Drift names it; a converge removes it,
    fetches nothing, verifies, evicts; nothing outside is read (a FIFO there would hang a root
    open), written or deleted."""
    h = th("spark-1")
    model = h.check_output(f"ls -d {SPARK_MODEL}/*/").split()[-1].rstrip("/")
    canary = "/root/servefleet-canary"
    h.run(
        f"rm -rf {canary} && install -d -m 711 {canary} && echo secret > {canary}/f && "
        f"chmod 600 {canary}/f && mkfifo -m 666 {canary}/pipe"
    )
    outside = h.check_output(f"ls -la --time-style=+%s {canary} /etc/passwd | sort")
    planted = [
        f"ln -s {canary} {model}/dir",
        f"ln -s {canary}/pipe {model}/pipe.safetensors",
        f"ln -s /etc {model}/etc",
        f"ln -s . {model}/loop",
        f"mkfifo {model}/fifo.json",
        f"echo planted > {model}/extra.safetensors",
        f"rm -rf {model}/.servefleet && ln -s {canary} {model}/.servefleet",
        f"install -d {model}/.cache/huggingface && ln -s {canary} "
        f"{model}/.cache/huggingface/download",
    ]
    for cmd in planted:
        h.run_test(f"runuser -u servefleet -- sh -c {shlex.quote(cmd)}")
    rc, report = _drift("spark-1")
    assert rc == 1, report
    model_item = next(
        i
        for i in report["hosts"]["spark-1"]["items"]
        if i["state"] == "drifted" and "not part of the model" in json.dumps(i)
    )
    assert "extra.safetensors" in json.dumps(model_item)
    started = time.monotonic()
    run = pyinfra(
        "inventory/testbed.py",
        NODES["spark-1"],
        limit="spark-1",
        data={"page_cache_policy": "always"},
        timeout=900,
    )
    assert run.returncode == 0, run.output[-3000:]
    assert time.monotonic() - started < 600  # no FIFO held it
    left = h.check_output(
        f"find {model} \\( -type l -o -type p -o -name extra.safetensors \\) -print"
    )
    assert left == "", left
    assert h.file(f"{ROOT}/state/page-cache-evict.json").exists
    assert h.check_output(f"ls -la --time-style=+%s {canary} /etc/passwd | sort") == outside
    assert h.check_output(f"cat {canary}/f") == "secret"
    assert pyinfra("inventory/testbed.py", NODES["spark-1"], limit="spark-1").changed == 0
    h.run(f"rm -rf {canary}")


def test_names_that_are_not_utf8_or_hold_a_newline_reach_the_operator_whole(served, th):
    """The engine plants a file whose name is not UTF-8 and one whose name forges a line of
    the listing (`config.json<newline>10 model.safetensors`). pyinfra reads node output as
    UTF-8 lines; the names travel base64-encoded, so drift names both, escaped, on one line
    each (never "verified"), status says the model is not verified, and a converge removes
    them with no traceback; the next converge changes nothing."""
    h = th("spark-1")
    model = h.check_output(f"ls -d {SPARK_MODEL}/*/").split()[-1].rstrip("/")
    plant = (
        f"import os; d = os.fsencode({model!r}); "
        "open(d + b'/bad\\xffname.safetensors', 'w').write('x'); "
        "open(d + b'/config.json\\n10 model.safetensors', 'w').write('x')"
    )
    h.run_test(f"runuser -u servefleet -- python3 -c {shlex.quote(plant)}")
    rc, report = _drift("spark-1")
    assert rc == 1, report
    said = json.dumps(report)
    assert "bad\\\\xffname.safetensors" in said, said[-3000:]  # \xff as JSON writes it
    assert "config.json\\\\n10 model.safetensors" in said, said[-3000:]
    status = subprocess.run(
        [
            sys.executable,
            "-m",
            "servefleet.cli",
            "status",
            "inventory/testbed.py",
            "--limit",
            "spark-1",
            "--json",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "Traceback" not in status.stderr, status.stderr[-3000:]
    (node,) = json.loads(status.stdout)["hosts"].values()
    assert node["model"].endswith("(not verified)"), status.stdout
    run = pyinfra("inventory/testbed.py", NODES["spark-1"], limit="spark-1", timeout=900)
    assert "Traceback" not in run.output and "UnicodeDecodeError" not in run.output, run.output[
        -3000:
    ]
    assert run.returncode == 0, run.output[-3000:]
    left = h.check_output(f"find {model} -name 'bad*' -o -name 'config.json?10*'")
    assert left == "", left
    assert pyinfra("inventory/testbed.py", NODES["spark-1"], limit="spark-1").changed == 0


def _drift(host: str):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "servefleet.cli",
            "drift",
            "inventory/testbed.py",
            NODES[host],
            "--limit",
            host,
            "--json",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr
