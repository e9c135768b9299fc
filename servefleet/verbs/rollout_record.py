"""The last rollout, kept on each node it reached (core.rollout_record): written when
`servefleet rollout` ends, so that `servefleet report`, from any operator machine, shows its
batches and verdicts."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict

from servefleet.core.layout import NodeLayout
from servefleet.core.rollout_record import LastRollout
from servefleet.operations.files import put
from servefleet.verbs.rollout_report import RolloutReport


def records(report: RolloutReport, groups: list[list[str]], when: str) -> dict[str, LastRollout]:
    """Each host's record of the rollout: its batch, its part of the report."""
    out = {}
    for number, group in enumerate(groups, 1):
        for name in group:
            if name in report.hosts:
                out[name] = LastRollout(
                    report.rollout_id,
                    when,
                    number,
                    len(groups),
                    tuple(group),
                    int(report.exit_code),
                    report.message,
                    asdict(report.hosts[name]),
                )
    return out


def save(
    session_of: Callable, report: RolloutReport, groups: list[list[str]], say: Callable
) -> None:
    """Write each host's record (state/last-rollout.json); a host where it cannot be written is
    said, and changes nothing else: the rollout's own result stands."""
    kept = records(report, groups, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    if not kept:
        return

    def write(host) -> bool:
        path = NodeLayout.of(host.data).last_rollout
        return put(host.state, host, path, kept[host.name].dumps().encode())

    try:
        with session_of(list(kept)) as sess:
            written = sess.each(write)
    except Exception as exc:  # the rollout is done: its report is printed whatever this says
        written = {n: exc for n in kept}
    for name in kept:
        if written.get(name) is not True:
            got = written.get(name)
            why = "not reached" if got is None else "the upload failed" if got is False else got
            say(f"{name}: the rollout's record (for `servefleet report`) was not written: {why}")
