"""The demo's verdicts: what each step claims, judged per host, whatever the other hosts did.

A step gives each host it concerns one verdict: `pass`, `fail` (the claim did not hold on it) or
`unreachable` (it could not be reached for that step), with a detail that says what was seen.
The run ends with one line, machine-checkable (docs/testbed.md, "The demo"):

    demo: PASSED: every step on every host; exit 0
    demo: FAILED: spark-1 unreachable at 2, 3, 4, 6, 7; all else passed; exit 3

The exit code is fleet verbs' (servefleet/core/errors.py): 0 every step passed on every host,
1 a step failed on a host, 3 a host could not be reached for a step (3 wins over 1).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from servefleet.cli import json_report
from servefleet.cli.output import table, wrap
from servefleet.core.errors import Exit

PASS, FAIL, UNREACHABLE = "pass", "fail", "unreachable"
VERDICTS = (PASS, FAIL, UNREACHABLE)

# (key, title): the steps in order; a step's number is its place here, from 1.
STEPS = (
    ("up", "Testbed up: real Debian hosts (systemd-nspawn), reached as a sudo user"),
    ("converge", "Converge both recipes (first run on a machine: minutes)"),
    ("again", "Converge again: nothing to change"),
    ("drift", "Drift check: every host in sync"),
    ("inject", "Hand-edit the unit on {llama}: drift caught, converge repairs"),
    ("bench", "Bench the serving nodes ({runs} runs, tiny models)"),
    ("status", "Status: serving, /health 200, a release recorded"),
)
NUMBER = {key: n for n, (key, _) in enumerate(STEPS, 1)}
# The grid's short names, one per step.
SHORT = {
    "up": "testbed up",
    "converge": "converge",
    "again": "nothing to change",
    "drift": "in sync",
    "inject": "drift caught, fixed",
    "bench": "bench",
    "status": "status",
}


@dataclass
class Verdict:
    verdict: str  # pass | fail | unreachable
    detail: str = ""


@dataclass
class Report:
    hosts: list[str]
    instance: int = 0
    # step key -> host -> verdict, in the order judged
    steps: dict[str, dict[str, Verdict]] = field(default_factory=dict)

    def judge(self, step: str, host: str, verdict: str, detail: str = "") -> None:
        """A host's verdict for a step; the first one given stands (a step that fails half-way
        judges the hosts it had not judged yet, and only those)."""
        assert verdict in VERDICTS, verdict
        if host not in self.hosts:
            self.hosts.append(host)
        self.steps.setdefault(step, {}).setdefault(host, Verdict(verdict, detail))

    def judged(self, step: str) -> dict[str, Verdict]:
        return self.steps.get(step, {})

    def step_lines(self, step: str, cols: int = 80) -> list[str]:
        """A step's verdicts: one line naming each host's, then why for each host that did not
        pass (wrapped whole, never cut) and what passed, shortly."""
        judged = {h: self.judged(step)[h] for h in self.hosts if h in self.judged(step)}
        if not judged:
            return wrap(f"step {NUMBER[step]} verdict: no host judged", cols, "  ", "    ")
        lines = wrap(
            f"step {NUMBER[step]} verdict: "
            + ", ".join(f"{host} {v.verdict}" for host, v in judged.items()),
            cols,
            "  ",
            "    ",
        )
        for host, v in judged.items():
            if v.detail:
                lines += wrap(f"{host}: {v.detail}", cols, "    ", "      ")
        return lines

    def grid(self, cols: int = 80) -> str:
        """Every step against every host: pass, fail, unreachable, or - (not its step)."""
        rows = [
            (
                f"{NUMBER[key]} {SHORT[key]}",
                *(
                    self.judged(key)[h].verdict if h in self.judged(key) else None
                    for h in self.hosts
                ),
            )
            for key, _ in STEPS
            if key in self.steps
        ]
        return table(("step", *self.hosts), rows, cols, shrink=self.hosts)

    def not_passed(self) -> dict[tuple[str, str], list[int]]:
        """(host, verdict) -> the numbers of the steps with that verdict, for every verdict
        that is not a pass; hosts in the order given, steps in order."""
        out: dict[tuple[str, str], list[int]] = {}
        for host in self.hosts:
            for verdict in (FAIL, UNREACHABLE):
                numbers = [
                    NUMBER[key]
                    for key, _ in STEPS
                    if self.judged(key).get(host, Verdict(PASS)).verdict == verdict
                ]
                if numbers:
                    out[(host, verdict)] = numbers
        return out

    @property
    def exit_code(self) -> Exit:
        verdicts = {v.verdict for s in self.steps.values() for v in s.values()}
        if not verdicts:  # nothing was judged: nothing passed
            return Exit.DIFFERS
        if UNREACHABLE in verdicts:
            return Exit.UNREACHABLE
        return Exit.DIFFERS if FAIL in verdicts else Exit.OK

    def final_line(self) -> str:
        code = int(self.exit_code)
        if code == 0:
            return "demo: PASSED: every step on every host; exit 0"
        failed = [
            f"{host} {'failed' if verdict == FAIL else verdict} at {', '.join(map(str, steps))}"
            for (host, verdict), steps in self.not_passed().items()
        ]
        passed = any(v.verdict == PASS for s in self.steps.values() for v in s.values())
        rest = "all else passed" if passed else "nothing passed"
        return f"demo: FAILED: {'; '.join(failed or ['no step judged'])}; {rest}; exit {code}"

    def host_verdict(self, host: str) -> str:
        """passed (every step it was judged in), unreachable (it passed wherever it was
        reached), or failed."""
        seen = {s[host].verdict for s in self.steps.values() if host in s}
        if FAIL in seen:
            return "failed"
        return UNREACHABLE if UNREACHABLE in seen else "passed"

    def to_json(self) -> dict:
        """--json: the fleet verbs' shape (servefleet/cli/json_report.py): each host's verdict
        and its steps' (by key), counted by host verdict; the steps in order, the final line."""
        hosts = {
            host: {
                "verdict": self.host_verdict(host),
                "steps": {
                    key: asdict(self.judged(key)[host])
                    for key, _ in STEPS
                    if host in self.judged(key)
                },
            }
            for host in self.hosts
        }
        summary = json_report.counts(
            (h["verdict"] for h in hosts.values()), ("passed", "failed", UNREACHABLE)
        )
        return json_report.document(
            hosts,
            summary,
            int(self.exit_code),
            instance=self.instance,
            steps=[{"number": NUMBER[key], "key": key, "name": SHORT[key]} for key, _ in STEPS],
            line=self.final_line(),
        )
