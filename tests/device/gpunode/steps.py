"""The GPU node's steps, run by tests/device/gpunode.sh in the launching chroot (the operator's
side: the image's Python with pyinfra, the project as the working directory).

    python3 tests/device/gpunode/steps.py STEP...   (converge, again, drift, rollout,
                                                    rollback, broken, final; inspect, gate)

Each step drives the product as an operator does (pyinfra's CLI, the servefleet verbs), then
reads the node as root over SSH, and writes RESULTS/<step>.json and RESULTS/<step>.log.
A step that finds what it claims false exits 1 (the rest still run: see the summary).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from servefleet.core import sandbox  # noqa: E402
from servefleet.engines.llamacpp import logic as llamacpp  # noqa: E402
from servefleet_dev.testbed import gpunode  # noqa: E402
from servefleet_dev.testing.pyinfra_cli import pyinfra  # noqa: E402

HERE = os.environ.get("SERVEFLEET_GPUNODE_DIR", "/gpunode")
RESULTS = Path(os.environ.get("GPUNODE_RESULTS", f"{HERE}/results"))
INVENTORY = "tests/device/gpunode/h200_gpu.py"
DEPLOY = "deploys/serve_q4_llamacpp.py"
UNIT = "servefleet-llama.service"
GPU = os.environ.get("SERVEFLEET_GPUNODE_REHEARSAL") != "1"
# The second release of the rollout: a data change the unit carries (llama-server -c).
SECOND = {"llamacpp_context": "32768"}
# The units' allow list without char-nvidia (and char-nvidiactl, the same major): the bug class
# of last round (the old list named char-nvidia-frontend, which the open module does not have).
BROKEN_GROUPS = ("nvidia-frontend", "nvidia-uvm", "nvidia-caps")


def node(cmd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """A root shell command on the node, over SSH with its pinned key."""
    return subprocess.run(
        [
            "ssh",
            "-i",
            f"{HERE}/ssh/id_ed25519",
            "-p",
            str(gpunode.SSH_PORT),
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={HERE}/ssh/known_hosts",
            "-o",
            "BatchMode=yes",
            "-o",
            "LogLevel=ERROR",
            "root@127.0.0.1",
            cmd,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def out(cmd: str) -> str:
    r = node(cmd)
    return (r.stdout + r.stderr).strip()


def servefleet(*args: str, timeout: float = 580) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "servefleet.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "160"},
    )


def serving() -> dict:
    """What a user checks on a serving node: the unit's state and sandbox, the server's
    process, /health, one chat, where llama-server put the layers."""
    show = out(
        f"systemctl show {UNIT} -p ActiveState -p SubState -p MainPID -p DevicePolicy "
        "-p DeviceAllow -p User -p MemoryDenyWriteExecute -p NRestarts"
    )
    port = 8080
    health = out(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health")
    chat = out(
        f"curl -s http://127.0.0.1:{port}/v1/chat/completions -H 'Content-Type: "
        'application/json\' -d \'{"model": "tiny-qwen35moe", "max_tokens": 8, '
        '"messages": [{"role": "user", "content": "hello"}]}\''
    )
    journal = out(
        f"journalctl -u {UNIT} -b -o cat --no-pager | grep -E "
        "'offload|CUDA|assigned to device|device_info|model buffer|"
        "servefleet preflight|override|nvidia-modprobe' | tail -n 40"
    )
    apps = (
        out("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader")
        if GPU
        else ""
    )
    args = out("ps -o user:32=,args= -C llama-server")
    try:
        reply = json.loads(chat)["choices"][0]["message"]["role"]
    except (ValueError, KeyError, IndexError, TypeError):
        reply = None
    shown: dict = {}
    for line in show.splitlines():  # DeviceAllow= comes once per entry
        if "=" in line:
            key, value = line.split("=", 1)
            shown[key] = f"{shown[key]}, {value}" if key in shown else value
    return {
        "systemctl_show": shown,
        "gpu_apps": apps,
        "health": health,
        "chat_role": reply,
        "chat": chat[:600],
        "process": args,
        "journal": journal.splitlines(),
        "offloaded": re.findall(r"offloaded \d+/\d+ layers to GPU", journal),
    }


def releases() -> dict:
    text = out("cat /opt/servefleet/state/releases.json")
    try:
        doc = json.loads(text)
    except ValueError:
        return {"unreadable": text[:300]}

    def brief(r):
        return r and {
            k: r.get(k)
            for k in (
                "engine",
                "version",
                "prefix",
                "model_dir",
                "recorded_at",
                "perf",
                "probe_argv",
            )
        } | {"id_of_unit": re.findall(r" -c (\d+)", r.get("unit_text", ""))}

    return {
        "current": brief(doc.get("current")),
        "previous": [brief(r) for r in doc.get("previous") or []],
        "rolled_back_from": brief(doc.get("rolled_back_from")),
    }


def probe_journal() -> list[str]:
    """The probe's transient unit and the service's starts, in time order (the probe must come
    first: it runs before a restart)."""
    return out(
        f"journalctl -b -o short-iso-precise --no-pager -u {UNIT.removesuffix('.service')}"
        f"-probe.service -u {UNIT} | grep -E 'Started|Stopped|Starting|GPU |lists no' "
        "| tail -n 30"
    ).splitlines()


def write(step: str, doc: dict, log: str) -> bool:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{step}.log").write_text(log)
    (RESULTS / f"{step}.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"== {step}: ok={doc.get('ok')} " + json.dumps(doc.get("checks", {}), default=str))
    return bool(doc.get("ok"))


def healthy(s: dict) -> bool:
    # b9785 prints no "offloaded N/N layers" at its default verbosity: the server's own
    # process holding GPU memory (nvidia-smi's compute apps) is what shows the weights there.
    pid = s["systemctl_show"].get("MainPID")
    offloaded = (not GPU) or any(
        line.split(",")[0].strip() == pid and "llama-server" in line
        for line in s["gpu_apps"].splitlines()
    )
    return (
        s["systemctl_show"].get("ActiveState") == "active"
        and s["health"] == "200"
        and s["chat_role"] == "assistant"
        and offloaded
    )


def step_converge() -> bool:
    t0 = time.monotonic()
    run = pyinfra(INVENTORY, DEPLOY, timeout=1500)
    s = serving()
    checks = {
        "rc": run.returncode,
        "changed": run.changed,
        "healthy": healthy(s),
        "device_policy": s["systemctl_show"].get("DevicePolicy"),
        "override_kv": "--override-kv" in s["process"],
        "user": s["process"].split()[0] if s["process"] else None,
    }
    ok = (
        run.returncode == 0
        and checks["healthy"]
        and checks["device_policy"] == "closed"
        and checks["override_kv"]
        and checks["user"] == "servefleet"
    )
    doc = {
        "ok": ok,
        "checks": checks,
        "seconds": round(time.monotonic() - t0, 1),
        "serving": s,
        "probe_output": probe_now(),
        "releases": releases(),
        "preflight": out("cat /opt/servefleet/state/preflight.json 2>/dev/null | head -c 2000"),
        "gpu": out(
            "nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used "
            "--format=csv,noheader; nvidia-smi -L"
        )
        if GPU
        else "rehearsal: no GPU",
        "build": out("cat /opt/servefleet/llama.cpp/current/build.json"),
        "systemd": out("systemctl --version | head -n 1; systemctl is-system-running"),
        "security": out(f"systemd-analyze security --no-pager {UNIT} | tail -n 1"),
        "unit": out(f"cat /etc/systemd/system/{UNIT}"),
    }
    (RESULTS / "servefleet-llama.service").parent.mkdir(parents=True, exist_ok=True)
    (RESULTS / "servefleet-llama.service").write_text(doc["unit"] + "\n")
    return write("converge", doc, run.output)


def step_again() -> bool:
    pid = serving()["systemctl_show"].get("MainPID")
    run = pyinfra(INVENTORY, DEPLOY, timeout=300)
    after = serving()
    checks = {
        "rc": run.returncode,
        "operations": run.operations,
        "changed": run.changed,
        "no_change": run.no_change,
        "same_pid": after["systemctl_show"].get("MainPID") == pid,
    }
    ok = run.returncode == 0 and run.changed == 0 and run.operations > 0 and checks["same_pid"]
    return write("again", {"ok": ok, "checks": checks}, run.output)


def step_drift() -> bool:
    r = servefleet("drift", INVENTORY, DEPLOY)
    return write(
        "drift", {"ok": r.returncode == 0, "checks": {"rc": r.returncode}}, r.stdout + r.stderr
    )


def step_rollout() -> bool:
    args = [a for k, v in SECOND.items() for a in ("--data", f"{k}={v}")]
    r = servefleet("rollout", INVENTORY, DEPLOY, *args)
    rel = releases()
    s = serving()
    perf = (rel.get("current") or {}).get("perf")
    checks = {
        "rc": r.returncode,
        "healthy": healthy(s),
        "context": rel["current"]["id_of_unit"] if rel.get("current") else None,
        "perf_recorded": bool(perf),
    }
    ok = (
        r.returncode == 0
        and checks["healthy"]
        and checks["context"] == [SECOND["llamacpp_context"]]
        and checks["perf_recorded"]
    )
    return write(
        "rollout", {"ok": ok, "checks": checks, "releases": rel, "serving": s}, r.stdout + r.stderr
    )


def step_rollback() -> bool:
    r = servefleet("rollback", INVENTORY, "--limit", gpunode.NODE)
    rel, s, probes = releases(), serving(), probe_journal()
    checks = {
        "rc": r.returncode,
        "healthy": healthy(s),
        "context": rel["current"]["id_of_unit"] if rel.get("current") else None,
        "probe_ran": any("probe" in line and "Started" in line for line in probes),
    }
    ok = (
        r.returncode == 0
        and checks["healthy"]
        and checks["context"] == ["65536"]
        and checks["probe_ran"]
    )
    return write(
        "rollback",
        {"ok": ok, "checks": checks, "releases": rel, "serving": s, "probe_journal": probes},
        r.stdout + r.stderr,
    )


def step_broken() -> bool:
    """A unit whose allow list lacks char-nvidia: the probe refuses it before the restart; the
    unit on disk and the running server are the ones from before."""
    before, unit = serving(), out(f"cat /etc/systemd/system/{UNIT}")
    patch = (
        f"import servefleet.core.sandbox as s; s.NVIDIA_DEVICE_GROUPS = {BROKEN_GROUPS!r}; "
        "import sys; from pyinfra_cli.main import main; "
        f"sys.argv = ['pyinfra', '-y', {INVENTORY!r}, {DEPLOY!r}]; sys.exit(main())"
    )
    if not GPU:  # without a GPU there is no device list to break: the probe must still run
        patch = patch.replace("s.NVIDIA_DEVICE_GROUPS", "s.NVIDIA_DEVICE_GROUPS_UNUSED")
    r = subprocess.run(
        [sys.executable, "-c", patch],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )
    log = r.stdout + r.stderr
    after = serving()
    refused = [line for line in log.splitlines() if "the sandbox probe" in line]
    checks = {
        "rc": r.returncode,
        "refused_line": refused[:1],
        "unit_unchanged": out(f"cat /etc/systemd/system/{UNIT}") == unit,
        "same_pid": after["systemctl_show"].get("MainPID")
        == before["systemctl_show"].get("MainPID"),
        "still_healthy": healthy(after),
    }
    ok = (
        (
            r.returncode != 0
            and bool(refused)
            and "lists no GPU" in refused[0]
            and checks["unit_unchanged"]
            and checks["same_pid"]
            and checks["still_healthy"]
        )
        if GPU
        else (checks["unit_unchanged"] and checks["still_healthy"])
    )
    return write("broken", {"ok": ok, "checks": checks, "probe_journal": probe_journal()}, log)


def step_inspect() -> bool:
    """converge.json again from the node, the first converge's log kept (a check of this
    script's that was wrong then)."""
    doc = json.loads((RESULTS / "converge.json").read_text())
    s = serving()
    doc["serving"] = s
    doc["checks"]["healthy"] = healthy(s)
    doc["probe_output"] = probe_now()
    doc["ok"] = (
        doc["checks"]["rc"] == 0
        and doc["checks"]["healthy"]
        and doc["checks"]["device_policy"] == "closed"
        and doc["checks"]["override_kv"]
        and doc["checks"]["user"] == "servefleet"
    )
    return write("converge", doc, (RESULTS / "converge.log").read_text())


def probe_now() -> str:
    """The recipe's own probe (servefleet.core.sandbox) under the installed unit's sandbox, as
    root over SSH: what the converge ran before the start, with its output this time."""
    unit = out(f"cat /etc/systemd/system/{UNIT}")
    user, props, env, gpu = sandbox.unit_sandbox(unit)
    data = gpunode.recipe_data()
    if not GPU:
        data["require_gpu"] = False
    argv = llamacpp.probe_argv(data) if GPU else sandbox.version_argv(unit)
    script = sandbox.probe_script(UNIT, user, props, env, argv, gpu)
    r = node(f"sh -c {shlex.quote(script)}")
    return f"rc {r.returncode}\n{r.stdout}{r.stderr}"


def step_final() -> bool:
    """A converge after the rollback and the refused unit returns the node to the data (it
    clears the rollback's record), then status and drift are clean."""
    run = pyinfra(INVENTORY, DEPLOY, timeout=300)
    st = servefleet("status", INVENTORY, "--wide")
    d = servefleet("drift", INVENTORY, DEPLOY)
    checks = {
        "rc": run.returncode,
        "changed": run.changed,
        "healthy": healthy(serving()),
        "status_rc": st.returncode,
        "drift_rc": d.returncode,
    }
    ok = run.returncode == 0 and checks["healthy"] and st.returncode == 0 and d.returncode == 0
    return write(
        "final",
        {"ok": ok, "checks": checks, "releases": releases()},
        run.output
        + "\n--- status\n"
        + st.stdout
        + st.stderr
        + "\n--- drift\n"
        + d.stdout
        + d.stderr,
    )


def step_secrets() -> bool:
    """From inside the running engine's own sandbox (its mount namespace, uid and gid, entered
    by nsenter under real systemd) the hub token and root's records cannot be read; the same
    user outside the sandbox reads the token: the unit hides it, not a mode."""
    root = "/opt/servefleet"
    token = f"{root}/etc/hf-token"
    pid = out(f"systemctl show -P MainPID {UNIT}")
    ids = out(f"stat -c '%u %g' /proc/{pid}").split()
    planted = node(f"test -e {token}").returncode != 0
    if planted:  # the 4090 node fetches anonymously: a canary where recipes/models.py puts it
        node(f"install -m 400 -o servefleet -g root /dev/null {token} && echo canary > {token}")
    inside = f"nsenter -t {pid} -m -r -w -S {ids[0]} -G {ids[1]} --" if len(ids) == 2 else "false"
    seen = {}
    try:
        for path in (token, f"{root}/state/releases.json", f"{root}/models"):
            r = node(f"{inside} ls -l {path}")
            seen[path] = {"rc": r.returncode, "said": (r.stdout + r.stderr).strip()[:200]}
        r = node(f"runuser -u servefleet -- cat {token}")
        seen["outside"] = {"rc": r.returncode}
    finally:
        if planted:
            node(f"rm -f {token}")
    checks = {
        "uid": ids,
        "token_hidden": seen[token]["rc"] != 0,
        "records_hidden": seen[f"{root}/state/releases.json"]["rc"] != 0,
        "models_seen": seen[f"{root}/models"]["rc"] == 0,
        "outside_reads": seen["outside"]["rc"] == 0,
        "unit_says": out(f"systemctl show -P InaccessiblePaths {UNIT}"),
    }
    ok = all(v for k, v in checks.items() if k not in ("uid", "unit_says"))
    return write("secrets", {"ok": ok, "checks": checks, "seen": seen}, json.dumps(seen))


def step_gate() -> bool:
    """The performance gate's error rates on the GPU (benchmarks/perf_gate.py --node): trials of
    an equally fast release (A restarted) and of a slower one (--ubatch-size 1), each measured as
    a rollout measures it, judged by the rollout's rule with this host's thresholds (the
    product's, group_data/rtx4090.py). GATE_TRIALS per release (default 5); no background
    load here: the lent machine has 16 cores and no compile to run."""
    trials = os.environ.get("GATE_TRIALS", "5")
    traces = RESULTS / "gate-traces.json"
    RESULTS.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [
            sys.executable,
            "benchmarks/perf_gate.py",
            "--node",
            INVENTORY,
            gpunode.NODE,
            "--trials",
            trials,
            "--loads",
            "idle",
            "--traces",
            str(traces),
            # the switches' health gate: the unit up and healthy for 5 s, not the recipe's 30 s
            # (a trial switches releases four times; the measurements are the rollout's)
            "--data",
            "health_settle_s=5",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    rows = [line for line in r.stdout.splitlines() if line.startswith("idle ")]
    false_rollbacks = [
        int(line.split("false rollbacks: ")[1].rstrip(")"))
        for line in rows
        if "false rollbacks: " in line
    ]
    missed = [int(line.split("missed: ")[1].rstrip(")")) for line in rows if "missed: " in line]
    checks = {
        "rc": r.returncode,
        "trials": trials,
        "false_rollbacks": false_rollbacks,
        "missed": missed,
        "serving_after": healthy(serving()),
    }
    ok = r.returncode == 0 and len(rows) == 2 and checks["serving_after"]
    return write("gate", {"ok": ok, "checks": checks, "table": r.stdout}, r.stdout + r.stderr)


STEPS = {
    "gate": step_gate,
    "converge": step_converge,
    "again": step_again,
    "drift": step_drift,
    "rollout": step_rollout,
    "rollback": step_rollback,
    "broken": step_broken,
    "final": step_final,
    "inspect": step_inspect,
    "secrets": step_secrets,
}


def main(argv: list[str]) -> int:
    failed = []
    for name in argv:
        try:
            if not STEPS[name]():
                failed.append(name)
        except Exception as exc:  # one step's crash must not lose the others' results
            write(name, {"ok": False, "error": repr(exc)}, repr(exc))
            failed.append(name)
    print(f"== steps failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
