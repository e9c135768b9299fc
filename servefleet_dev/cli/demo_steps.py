"""The demo's steps: each runs the verb an operator would run, prints its report, and judges
every host the step concerns from that host's own result (demo_judge), whatever the other
hosts did: a host that went down is `unreachable` in the steps after, and the others' checks
still count (a drift on rtx4090-1 is caught, and repaired, with spark-1 unreachable)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console

from servefleet.cli import progress
from servefleet.cli.bench import render as render_bench
from servefleet.cli.drift import render as render_drift
from servefleet.cli.output import wrap
from servefleet.cli.status import render as render_status
from servefleet.core.layout import LLAMA_UNIT, NodeLayout
from servefleet.verbs import drift
from servefleet.verbs.bench import bench
from servefleet.verbs.session import HostOutcome, converge
from servefleet.verbs.status import status
from servefleet_dev.cli import demo_judge as judge
from servefleet_dev.cli.demo_report import FAIL, NUMBER, STEPS, UNREACHABLE, Report
from servefleet_dev.testbed import hosts as tb_hosts, lifecycle, material
from servefleet_dev.testbed.state import load_state, role_of

INVENTORY = "inventory/testbed.py"
BASE, BF16, Q4 = "deploys/base.py", "deploys/serve_bf16.py", "deploys/serve_q4_llamacpp.py"
RECIPES = (BF16, Q4)
SSH_CANNOT_CONNECT = 255  # ssh's own exit status when it could not reach the host
TITLES = dict(STEPS)


@dataclass
class Demo:
    console: Console
    report: Report
    names: list[str]
    bench_runs: int = 3
    specs: list[str] | None = None  # as given to `testbed up` (spark-1@trixie): names by default

    @property
    def llama(self) -> str | None:
        return next((n for n in self.names if role_of(n) == "rtx4090"), None)

    @property
    def serving(self) -> list[str]:
        return [n for n in self.names if role_of(n) in judge.SERVING_ROLES]

    def say(self, text: str) -> None:
        """A report, as its renderer fit it to the terminal."""
        self.console.print(text, markup=False, highlight=False)

    def tell(self, text: str) -> None:
        """One of the demo's own lines, indented, wrapped whole to the terminal."""
        for line in wrap(text, self.console.width, "  ", "    "):
            self.say(line)

    @contextmanager
    def step(self, key: str, hosts: list[str], **fmt: object) -> Iterator[None]:
        """A step: its title; then its verdicts. When its own work raises, every host it had
        not judged yet fails with the reason, and the demo goes on to the next step."""
        self.console.rule(f"{NUMBER[key]}. {TITLES[key].format(**fmt)}")
        try:
            yield
        except Exception as exc:  # one step's failure is reported; the other steps still run
            why = f"{type(exc).__name__}: {exc}"
            for host in hosts:
                self.report.judge(key, host, FAIL, f"not checked: {why}")
        for line in self.report.step_lines(key, self.console.width):
            self.say(line)

    def _logged(self, line: progress.Line):
        def log(message: str) -> None:
            self.tell(message)
            line.detail(message)

        return log

    def _converge(self, deploy: str, limit: list[str]) -> dict[str, HostOutcome]:
        with progress.status(self.console, f"converging {deploy}") as line:
            outcomes = converge(INVENTORY, deploy, limit, on_operation=line.detail)
        for name, o in sorted(outcomes.items()):
            verdict = "ok" if o.ok else "not reached" if o.unreachable else f"FAILED: {o.error}"
            self.tell(f"{deploy} on {name}: {o.changed} of {o.operations} changed -> {verdict}")
        return outcomes

    def _drift(self, deploy: str, limit: list[str]) -> drift.Report:
        with progress.status(self.console, f"checking drift against {deploy}"):
            report = drift.check(INVENTORY, deploy, limit)
        self.say(render_drift(report))
        return report

    # --- the steps ---------------------------------------------------------------------------

    def up(self) -> None:
        """1. The hosts booted to the end; the test material is ready."""
        with self.step("up", self.names):
            broke = material_error = None
            with progress.status(self.console, "bringing the testbed up") as line:
                try:
                    lifecycle.up(self.specs or self.names, log=self._logged(line))
                except (RuntimeError, TimeoutError, OSError, subprocess.SubprocessError) as exc:
                    broke = f"{type(exc).__name__}: {exc}"  # judged per host below
                    self.tell(f"testbed up: {broke}")
                line.phase("preparing the test material (models, wheels, llama.cpp host build)")
                try:
                    material.prepare(log=self._logged(line))
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    material_error = f"{type(exc).__name__}: {exc}"
            self.tell(f"testbed instance {self.report.instance}")
            rows = {row["name"]: row["systemd"] for row in lifecycle.status()}
            for name in self.names:
                self.report.judge("up", name, *judge.host_up(rows.get(name), material_error))

    def converge_all(self, key: str) -> None:
        """2. Both recipes (and the depot's base) converged on every host; 3. again: nothing
        changed."""
        with self.step(key, self.names):
            depots = [n for n in self.names if role_of(n) == "depot"]
            runs = [(BASE, depots)] if depots else []
            results: dict[str, list[tuple[str, HostOutcome]]] = {n: [] for n in self.names}
            for deploy, limit in runs + [(d, self.names) for d in RECIPES]:
                for name, outcome in self._converge(deploy, limit).items():
                    results.setdefault(name, []).append((deploy, outcome))
            for name, done in results.items():
                self.report.judge(key, name, *judge.converged(done, again=key == "again"))

    def in_sync(self) -> None:
        """4. Every host in sync with both recipes."""
        with self.step("drift", self.names):
            reports = [(d, self._drift(d, self.names)) for d in RECIPES]
            for name in self.names:
                self.report.judge(
                    "drift", name, *judge.in_sync([(d, r.hosts.get(name)) for d, r in reports])
                )

    def inject(self) -> None:
        """5. A hand-edited unit on the llama.cpp host: the drift check of the whole testbed
        catches it there (whatever it finds elsewhere), a converge repairs it, in sync again.
        The repair runs whatever the check said: the node never keeps the hand-edited unit."""
        host = self.llama
        if host is None:
            return
        with self.step("inject", [host], llama=host):
            unit = NodeLayout.unit_path(LLAMA_UNIT)
            edit = self._ssh(host, f"sed -i 's/^RestartSec=.*/RestartSec=1/' {unit}")
            if edit.returncode != 0:
                why = (edit.stderr.strip().splitlines() or [f"exit {edit.returncode}"])[-1]
                verdict = UNREACHABLE if edit.returncode == SSH_CANNOT_CONNECT else FAIL
                self.report.judge("inject", host, verdict, f"could not hand-edit {unit}: {why}")
                return
            self.tell(f"hand-edited {host}'s unit ({LLAMA_UNIT}): RestartSec=1")
            report = self._drift(Q4, self.names)  # the whole testbed, as an operator checks
            item = judge.caught(report.hosts.get(host), unit)
            self.tell(f"drift caught on {host}: {'yes (its unit file)' if item else 'NO'}")
            outcome = self._converge(Q4, [host]).get(host)
            after = self._drift(Q4, [host]).hosts.get(host)
            self.report.judge(
                "inject", host, *judge.repaired(report.hosts.get(host), unit, outcome, after)
            )

    def bench(self) -> None:
        """6. Each serving node answers the bench, both figures measured."""
        if not self.serving:
            return
        with self.step("bench", self.serving, runs=self.bench_runs):
            with progress.status(self.console, f"benching {', '.join(self.serving)}"):
                results = bench(
                    INVENTORY, self.serving, runs=self.bench_runs, prompt_tokens=256, max_tokens=64
                )
            self.say(render_bench(results, self.bench_runs, 64))
            for r in results:
                if not r.skipped:
                    self.report.judge("bench", r.host, *judge.benched(r))
            for name in self.serving:
                self.report.judge("bench", name, FAIL, "not benched")

    def status(self) -> None:
        """7. Status read on every host; each serving node active, /health 200, a release."""
        with self.step("status", self.names):
            with progress.status(self.console, "reading each node's status"):
                nodes = status(INVENTORY, self.names)
            self.say(render_status(nodes))
            for node in nodes:
                self.report.judge("status", node.host, *judge.serving(node))
            for name in self.names:
                self.report.judge("status", name, FAIL, "no status read")

    def _ssh(self, name: str, command: str) -> subprocess.CompletedProcess:
        rec = load_state().hosts.get(name)
        if rec is None:
            return subprocess.CompletedProcess([], 1, "", f"{name} is not in the testbed")
        return subprocess.run(
            [*tb_hosts.ssh_args(rec), command], capture_output=True, text=True, timeout=120
        )
