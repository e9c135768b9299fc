"""servefleet's node metrics where operators look (issue #30): on a testbed llama.cpp host, the
real `prometheus-node-exporter` and `prometheus` from Debian (apt in the guest, both bound to
loopback), a converge, a drift check and a rollout through both gates, then Prometheus's HTTP
API answers what a user checks: the release serving and the previous one, health 1, drift in
sync 1 with recent check times, the gate's decode tok/s and TTFT per release; and the docs'
alert expressions fire on a drifted node and go quiet once it is repaired.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time

import pytest
import testinfra
import yaml

from servefleet.core.releases import Release
from servefleet_dev.testbed import material
from servefleet_dev.testbed.state import known_hosts_path, load_state
from servefleet_dev.testing.pyinfra_cli import REPO_ROOT, pyinfra, reads_of_a_noop

pytestmark = pytest.mark.e2e
INVENTORY = "inventory/testbed.py"
Q4 = "deploys/serve_q4_llamacpp.py"
HOST = "rtx4090-1"
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"  # Debian's, metrics_textfile_dir's default
TEXTFILE = f"{TEXTFILE_DIR}/servefleet.prom"
UNIT = "/etc/systemd/system/servefleet-llama.service"
PROM = "http://127.0.0.1:9090"
CLI = [sys.executable, "-c", "from servefleet.cli import main; raise SystemExit(main())"]
PROMETHEUS_YML = """\
global:
  scrape_interval: 2s
  evaluation_interval: 2s
scrape_configs:
  - job_name: node
    static_configs:
      - targets: ["127.0.0.1:9100"]
"""
# Installed with their services held back (policy-rc.d), configured to listen on loopback only,
# then started: no moment on the network's addresses.
INSTALL = f"""
set -e
printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends prometheus prometheus-node-exporter >/dev/null
rm -f /usr/sbin/policy-rc.d
echo 'ARGS="--web.listen-address=127.0.0.1:9100 --collector.textfile.directory={TEXTFILE_DIR}"' \
  > /etc/default/prometheus-node-exporter
echo 'ARGS="--web.listen-address=127.0.0.1:9090"' > /etc/default/prometheus
printf %s {shlex.quote(PROMETHEUS_YML)} > /etc/prometheus/prometheus.yml
systemctl restart prometheus-node-exporter prometheus
"""
PURGE = """
systemctl stop prometheus prometheus-node-exporter || true
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq prometheus prometheus-node-exporter >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq --purge >/dev/null
rm -rf /var/lib/prometheus/metrics2
"""


def timed(what: str, func, *args, **kwargs):
    start = time.monotonic()
    result = func(*args, **kwargs)
    print(f"[prometheus] {what}: {time.monotonic() - start:.1f} s")
    return result


def cli(*args: str):
    return subprocess.run(
        [*CLI, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800
    )


def converge(**data):
    run = timed("converge", pyinfra, INVENTORY, Q4, limit=HOST, data=data, timeout=40 * 60)
    assert run.returncode == 0, run.output[-4000:]
    return run


def drift() -> int:
    return timed("drift", cli, "drift", INVENTORY, Q4, "--limit", HOST).returncode


def query(h, promql: str) -> list[dict]:
    """Prometheus's /api/v1/query, asked on the guest (it listens on loopback only)."""
    out = h.check_output(
        f"curl -sf --get --data-urlencode {shlex.quote('query=' + promql)} {PROM}/api/v1/query"
    )
    answer = json.loads(out)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def value(h, promql: str) -> float | None:
    result = query(h, promql)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def until(what: str, check, timeout: float = 90.0):
    """check() until it answers something truthy (Prometheus scrapes every 2 s)."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(1)
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last answer: {last!r})")


def records(h) -> dict:
    return json.loads(h.file("/opt/servefleet/state/releases.json").content_string)


@pytest.fixture(scope="module")
def monitored(testbed, ssh_key):
    """rtx4090-1 serving the testbed's llama.cpp release, with node_exporter and Prometheus
    from Debian watching it; afterwards both purged and the host converged back."""
    material.prepare(spark=False)
    record = load_state().hosts[HOST]
    h = testinfra.get_host(
        f"ssh://root@{record.address}:{record.ssh_port}",
        ssh_identity_file=ssh_key,
        ssh_extra_args=f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known_hosts_path()} "
        "-o LogLevel=ERROR",
    )
    installed = timed("apt install", h.run, f"sh -c {shlex.quote(INSTALL)}")
    assert installed.rc == 0, installed.stderr[-3000:]
    try:
        yield h
    finally:
        h.run(f"sh -c {shlex.quote(PURGE)}")
        pyinfra(INVENTORY, Q4, limit=HOST, timeout=40 * 60)


def test_prometheus_scrapes_the_release_health_drift_and_gate_figures(monitored):
    h = monitored
    started = time.time()
    converge()  # writes the textfile into the packages' directory
    # A no-op check: one read; drift one command more, which records it in sync.
    assert timed("no-op checks", reads_of_a_noop, INVENTORY, Q4, HOST) == {"dry": 1, "drift": 2}
    # A rollout to a new release (its data differs): the baseline bench on the release serving,
    # the converge, the health gate and the performance gate on the new one.
    rolled = timed(
        "rollout", cli, "rollout", INVENTORY, Q4, "--limit", HOST, "--json",
        "--data", "service_enabled=False",
    )  # fmt: skip
    assert rolled.stdout.strip(), rolled.stderr[-3000:]
    report = json.loads(rolled.stdout)
    rec = records(h)
    serving = Release.from_json(rec["current"])
    before = Release.from_json(
        rec["rolled_back_from"] if rec["rolled_back_from"] else rec["previous"][0]
    )
    assert serving.id != before.id, report

    # The file: root's, 0644, whole (nothing beside it), and not the engine's to change.
    f = h.file(TEXTFILE)
    assert (f.user, f.group, f.mode) == ("root", "root", 0o644)
    assert h.check_output(f"ls -A {TEXTFILE_DIR}") == "servefleet.prom"
    assert h.run(f"runuser -u servefleet -- sh -c 'echo x >> {TEXTFILE}'").rc != 0
    assert h.run(f"runuser -u servefleet -- touch {TEXTFILE_DIR}/x.prom").rc != 0

    # What a user checks in Prometheus, once it has scraped node_exporter after the rollout.
    until(
        "Prometheus shows the release serving now",
        lambda: query(h, f'servefleet_release_info{{role="serving",release="{serving.id}"}}'),
    )
    assert value(h, 'up{job="node"}') == 1
    assert value(h, "node_textfile_scrape_error") == 0  # node_exporter read the file whole
    (info,) = query(h, 'servefleet_release_info{role="serving"}')
    assert info["metric"]["engine"] == "llama.cpp" and info["metric"]["version"] == serving.version
    role = "rolled_back_from" if rec["rolled_back_from"] else "previous"
    (other,) = query(h, f'servefleet_release_info{{role="{role}"}}')
    assert other["metric"]["release"] == before.id
    now = time.time()
    assert value(h, "servefleet_health_ok") == 1
    assert started <= value(h, "servefleet_health_checked_timestamp_seconds") <= now
    assert value(h, "servefleet_drift_in_sync") == 1
    assert started <= value(h, "servefleet_drift_checked_timestamp_seconds") <= now
    assert value(h, "time() - servefleet_drift_checked_timestamp_seconds") < 3600
    # The gate's figures, per release: the baseline on the one before, the gate's on the new
    # (the figures each release's record keeps).
    kept = [rec["current"], *rec["previous"], rec["rolled_back_from"]]
    perf = {Release.from_json(d).id: d["perf"] for d in kept if d}
    for rel in (serving, before):
        decode = value(h, f'servefleet_gate_decode_tokens_per_second{{release="{rel.id}"}}')
        ttft = value(h, f'servefleet_gate_ttft_seconds{{release="{rel.id}"}}')
        assert decode == pytest.approx(perf[rel.id]["decode_tok_s"]) and decode > 0
        assert ttft == pytest.approx(perf[rel.id]["ttft_s"]) and ttft > 0


def doc_alerts() -> dict[str, str]:
    """The alert rules docs/day2.md shows: {alert: PromQL}."""
    text = (REPO_ROOT / "docs" / "day2.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "groups:" in b)
    return {r["alert"]: r["expr"] for r in yaml.safe_load(block)["groups"][0]["rules"]}


def test_the_docs_alerts_fire_on_a_drifted_node_and_clear_after_the_repair(monitored):
    h = monitored
    converge()  # the data's release again (the rollout above served another)
    assert drift() == 0
    alerts = doc_alerts()
    assert set(alerts) >= {
        "ServefleetUnhealthy",
        "ServefleetDrifted",
        "ServefleetNotCheckedForADay",
    }
    for name, expr in alerts.items():  # every one is PromQL Prometheus evaluates
        firing = query(h, expr)
        assert name == "ServefleetDecodeSlowerThanPrevious" or firing == [], (name, firing)
    h.run(f"sed -i 's/--threads 1/--threads 2/' {UNIT}")  # a hand edit behind servefleet's back
    assert drift() == 1
    until("the drift alert fires", lambda: query(h, alerts["ServefleetDrifted"]))
    assert query(h, alerts["ServefleetUnhealthy"]) == []
    converge()
    assert drift() == 0
    until("the drift alert clears", lambda: not query(h, alerts["ServefleetDrifted"]))
    assert query(h, alerts["ServefleetNotCheckedForADay"]) == []
