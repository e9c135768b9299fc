"""The page `servefleet report` writes: one self-contained HTML file (inline CSS, inline SVG
charts, no script, nothing fetched), readable in any browser and attachable to a ticket.

Sections: the fleet's status (as `servefleet status --wide`), the last rollout batch by batch
with each host's verdicts, and each node's release history: a table of its kept releases and
two charts, decode tok/s and time to first token per release (the last figures measured on each
release: a performance-gated rollout's baseline or gate, core.releases.Release.perf).

Everything a node supplies (names, releases, errors, verdicts) goes through `esc`."""

from __future__ import annotations

from servefleet.cli.report_svg import COLOURS, esc, line_chart
from servefleet.core.perf import Figures
from servefleet.core.rollout_record import RolloutView
from servefleet.verbs.report import NodeReport, ReleasePoint

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;
 color:#1f2937;background:#f8fafc}
header{background:#0f172a;color:#f8fafc;padding:18px 28px}
header h1{margin:0 0 4px;font-size:22px}
header .meta{color:#cbd5e1;margin:0}
main{padding:8px 28px 40px}
h2{margin:28px 0 10px;font-size:18px;border-bottom:2px solid #e2e8f0;padding-bottom:4px}
h3{margin:22px 0 6px;font-size:16px}
.cards{display:flex;gap:12px;margin:16px 0 0;padding:0;list-style:none;flex-wrap:wrap}
.cards li{background:#1e293b;border-radius:8px;padding:8px 14px}
.cards b{display:block;font-size:20px}
table{border-collapse:collapse;background:#fff;margin:6px 0 10px;font-size:13px}
th,td{border:1px solid #e2e8f0;padding:4px 8px;text-align:left;vertical-align:top}
td:first-child{white-space:nowrap}
th{background:#f1f5f9}
td.wrap{max-width:420px;overflow-wrap:anywhere}
.ok{color:#15803d;font-weight:600}.bad{color:#b91c1c;font-weight:600}
.warn{color:#b45309;font-weight:600}.muted{color:#64748b}
.charts{display:flex;gap:16px;flex-wrap:wrap}
svg.chart{background:#fff;border:1px solid #e2e8f0;border-radius:6px}
svg .title{font-size:13px;font-weight:600;fill:#1f2937}
svg .grid{stroke:#e5e7eb;stroke-width:1}
svg .tick{font-size:11px;fill:#6b7280;text-anchor:end}
svg .label,svg .value,svg .none{font-size:11px;text-anchor:middle}
svg .label{fill:#374151}svg .sub{fill:#6b7280}svg .value{fill:#111827;font-weight:600}svg .none{fill:#9ca3af}
.key{display:inline-block;width:12px;height:12px;border-radius:6px;margin:0 4px 0 10px;
 vertical-align:-1px}
"""
# A rollout's results, a unit's state, /health, a release's place: green, amber, else red.
GOOD = ("upgraded", "unchanged", "active", "200", "current")
WARN = ("rolled back", "inconclusive", "untouched", "previous", "rolled back from")


def _cls(value: object) -> str:
    text = str(value)
    if text in GOOD:
        return "ok"
    if text in WARN:
        return "warn"
    return "bad" if text not in ("", "None", "-") else "muted"


def _cell(value: object, cls: str = "") -> str:
    shown = "-" if value is None or value == "" else value
    return f'<td class="{cls}">{esc(shown)}</td>' if cls else f"<td>{esc(shown)}</td>"


def _table(headers: tuple[str, ...], rows: list[str]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def status_section(nodes: list[NodeReport]) -> str:
    rows = []
    for n in nodes:
        s = n.status
        if s.error:
            rows.append(
                f"<tr>{_cell(s.host)}{_cell(s.role)}"
                f'<td colspan="7" class="bad wrap">not read: {esc(s.error)}</td></tr>'
            )
            continue
        release = s.release
        if release and s.rolled_back_from:
            release = f"{release} (rolled back from {s.rolled_back_from})"
        rows.append(
            "<tr>"
            + _cell(s.host)
            + _cell(s.role)
            + _cell(s.engine_detail or s.engine)
            + f'<td class="wrap">{esc(s.model or "-")}</td>'
            + _cell(s.service, _cls(s.service))
            + _cell(s.health, _cls(s.health))
            + _cell(release)
            + _cell(s.previous_release)
            + _cell(
                None
                if s.memory_total_gib is None
                else f"{s.memory_used_gib}/{s.memory_total_gib} GiB"
            )
            + "</tr>"
        )
    headers = ("host", "role", "engine", "model", "service", "/health", "release", "previous")
    return "<h2>Fleet status</h2>" + _table((*headers, "memory"), rows)


def _seconds(value) -> str | None:
    return None if value is None else f"{value:.0f}"


def rollout_section(nodes: list[NodeReport]) -> str:
    found = {n.host: n.last_rollout for n in nodes if n.last_rollout}
    errors = [n for n in nodes if n.last_rollout_error]
    out = ["<h2>Last rollout</h2>"]
    view = RolloutView.of(found)
    if view is None:
        out.append('<p class="muted">No rollout has ended on these hosts yet.</p>')
    else:
        code = "ok" if view.exit_code == 0 else "bad"
        out.append(
            f"<p>Rollout <b>{esc(view.rollout_id)}</b>, ended {esc(view.finished_at)}, "
            f'{view.count} batch(es), exit <span class="{code}">{view.exit_code}</span>'
            + (f". {esc(view.message)}" if view.message else "")
            + "</p>"
        )
        headers = ("host", "from", "to", "result", "conv s", "gate s", "perf s", "back s")
        for number, members in view.batches:
            rows = []
            for name, h in members:
                if h is None:
                    rows.append(
                        f'<tr>{_cell(name)}<td colspan="9" class="muted">no record of this '
                        "rollout read on this host</td></tr>"
                    )
                    continue
                rows.append(
                    "<tr>"
                    + _cell(name)
                    + _cell(h.get("from_release"))
                    + _cell(h.get("to_release"))
                    + _cell(h.get("result"), _cls(h.get("result")))
                    + "".join(
                        _cell(_seconds(h.get(k)))
                        for k in ("converge_s", "gate_s", "perf_s", "rollback_s")
                    )
                    + f'<td class="wrap">{esc(h.get("perf") or "-")}</td>'
                    + f'<td class="wrap">{esc(h.get("detail") or "-")}</td>'
                    + "</tr>"
                )
            out.append(f"<h3>Batch {number} of {view.count}</h3>")
            out.append(_table((*headers, "performance gate", "detail"), rows))
        for name, rec in view.older:
            out.append(
                f'<p class="muted">{esc(name)}: its last rollout was {esc(rec.rollout_id)} '
                f"({esc(rec.result)}, ended {esc(rec.finished_at)}).</p>"
            )
    for n in errors:
        out.append(
            f'<p class="bad">{esc(n.host)}: its last rollout record cannot be read: '
            f"{esc(n.last_rollout_error)}</p>"
        )
    return "".join(out)


def _figure(fig: Figures | None, key: str) -> float | None:
    return None if fig is None else getattr(fig, key)


def _label(p: ReleasePoint, history: list[ReleasePoint]) -> str:
    """The release's name, with its id where another kept release has the same name."""
    twins = sum(q.name == p.name for q in history) > 1
    return f"{p.name} ({p.id[:6]})" if twins else p.name


def node_history(n: NodeReport) -> str:
    out = [f'<h3 id="history-{esc(n.host)}">{esc(n.host)}</h3>']
    if n.history_error:
        out.append(f'<p class="bad">The release records cannot be read: {esc(n.history_error)}</p>')
    if not n.history:
        if not n.history_error:
            why = n.status.error and "not read" or "no release recorded"
            out.append(f'<p class="muted">{esc(why)}.</p>')
        return "".join(out)
    rows = []
    for p in n.history:
        fig = p.figures
        rows.append(
            "<tr>"
            + _cell(_label(p, n.history))
            + _cell(p.id)
            + _cell(p.state, _cls(p.state))
            + _cell(p.recorded_at)
            + _cell(None if fig is None or fig.decode_tok_s is None else f"{fig.decode_tok_s:.1f}")
            + _cell(None if fig is None else f"{fig.ttft_s:.3f}")
            + _cell(None if fig is None else f"{fig.kind} {fig.measured_at}".strip())
            + f'<td class="wrap">{esc(fig.verdict if fig and fig.verdict else "-")}</td>'
            + "</tr>"
        )
    headers = ("release", "id", "state", "recorded", "decode tok/s", "TTFT s", "measured")
    out.append(_table((*headers, "verdict"), rows))
    twins = len({p.version for p in n.history}) < len(n.history)
    labels = [(p.version, p.id[:6] if twins else p.state) for p in n.history]
    decode = [_figure(p.figures, "decode_tok_s") for p in n.history]
    ttft = [_figure(p.figures, "ttft_s") for p in n.history]
    if all(v is None for v in ttft):
        out.append('<p class="muted">No bench figures recorded on these releases yet.</p>')
        return "".join(out)
    out.append(
        '<div class="charts">'
        + line_chart(
            "decode", "decode tok/s per release (higher is better)", "tok/s", labels, decode
        )
        + line_chart("ttft", "time to first token, s (lower is better)", "s", labels, ttft)
        + "</div>"
    )
    return "".join(out)


def history_section(nodes: list[NodeReport]) -> str:
    legend = "".join(
        f'<span class="key" style="background:{colour}"></span>{esc(name)}'
        for name, colour in (("decode tok/s", COLOURS["decode"]), ("TTFT s", COLOURS["ttft"]))
    )
    intro = (
        "<p>Each node's kept releases, oldest first, with the last bench figures measured on "
        f"each (a performance-gated rollout's baseline or gate).{legend}</p>"
    )
    serving = [n for n in nodes if n.history or n.history_error or n.status.engine]
    body = "".join(node_history(n) for n in serving)
    return "<h2>Release history</h2>" + intro + (body or '<p class="muted">No serving node.</p>')


def page(nodes: list[NodeReport], inventory: str, generated: str, version: str) -> str:
    read = [n for n in nodes if not n.status.error]
    healthy = sum(n.status.health == "200" for n in nodes)
    cards = (
        "".join(
            f"<li><b>{v}</b>{esc(k)}</li>"
            for k, v in (("hosts", len(nodes)), ("read", len(read)), ("healthy", healthy))
        )
        + f"<li><b>{len(nodes) - len(read)}</b>not read</li>"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>servefleet report: {esc(inventory)}</title><style>{CSS}</style></head><body>"
        f'<header><h1>servefleet fleet report</h1><p class="meta">{esc(inventory)} · '
        f"generated {esc(generated)} · servefleet {esc(version)}</p>"
        f'<ul class="cards">{cards}</ul></header><main>'
        f'<section id="status">{status_section(nodes)}</section>'
        f'<section id="rollout">{rollout_section(nodes)}</section>'
        f'<section id="history">{history_section(nodes)}</section>'
        "</main></body></html>\n"
    )
