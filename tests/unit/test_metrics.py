"""servefleet's node_exporter textfile as Prometheus reads it: parsed back with prometheus_client's
own parser (the text exposition format), hostile label values escaped, the checks record strict,
and the textfile directory refused where another account could write it."""

import dataclasses
import re
import stat
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from servefleet.core.metrics import Checks, escape_label, render
from servefleet.core.records import RecordError
from servefleet.core.releases import Release, Releases
from servefleet.fleet import contract
from servefleet.fleet.data import metrics_dir_problems
from servefleet.operations.metrics import dir_problem, write_command

UNIT = "[Service]\nExecStart=/opt/servefleet/llama.cpp/current/bin/llama-server\n"
OLD = Release(
    "llama.cpp",
    "b9785",
    "/p1",
    "servefleet-llama.service",
    UNIT,
    "org/m",
    "main",
    "a" * 40,
    "/m",
    "d",
)
NEW = dataclasses.replace(OLD, version="b9786", prefix="/p2")
GATE = {
    "decode_tok_s": 41.5,
    "ttft_s": 0.125,
    "measured_at": "2026-12-06T16:30:07Z",
    "kind": "gate",
}
BASE = {
    "decode_tok_s": 40.0,
    "ttft_s": 0.25,
    "measured_at": "2026-12-06T16:20:00Z",
    "kind": "baseline",
}


def parse(text: str) -> dict:
    """{sample name: [(labels, value)]} of the text, as Prometheus's client parses it."""
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_the_textfile_shows_releases_checks_and_gate_figures_per_release():
    records = Releases(
        dataclasses.replace(NEW, perf=GATE), (dataclasses.replace(OLD, perf=BASE),), None
    )
    checks = Checks(health_ok=True, health_at=1796574607, drift_in_sync=False, drift_at=1796574000)
    got = parse(render(records, checks))

    info = {labels["role"]: labels for labels, value in got["servefleet_release_info"]}
    assert set(info) == {"serving", "previous"}
    assert info["serving"]["version"] == "b9786" and info["serving"]["release"] == NEW.id
    assert info["previous"]["version"] == "b9785" and info["previous"]["engine"] == "llama.cpp"
    assert info["serving"]["model"] == "org/m" and info["serving"]["model_revision"] == "a" * 12
    assert got["servefleet_health_ok"] == [({}, 1.0)]
    assert got["servefleet_health_checked_timestamp_seconds"] == [({}, 1796574607.0)]
    assert got["servefleet_drift_in_sync"] == [({}, 0.0)]
    assert got["servefleet_drift_checked_timestamp_seconds"] == [({}, 1796574000.0)]
    decode = {labels["version"]: v for labels, v in got["servefleet_gate_decode_tokens_per_second"]}
    ttft = {labels["release"]: v for labels, v in got["servefleet_gate_ttft_seconds"]}
    assert decode == {"b9786": 41.5, "b9785": 40.0}
    assert ttft == {NEW.id: 0.125, OLD.id: 0.25}
    when = {labels["kind"]: v for labels, v in got["servefleet_gate_measured_timestamp_seconds"]}
    assert when == {"gate": 1796574607.0, "baseline": 1796574000.0}
    assert got["servefleet_records_readable"] == [({}, 1.0)]


def test_a_node_never_checked_shows_no_health_and_unreadable_records_say_so():
    """No health series rather than a 0 that would page someone; no release rather than a guess."""
    got = parse(render(Releases(unreadable="releases.json is not JSON"), Checks()))
    assert got == {"servefleet_records_readable": [({}, 0.0)]}


def test_each_family_is_declared_once_and_its_samples_stay_together():
    records = Releases(dataclasses.replace(NEW, perf=GATE), (OLD,), dataclasses.replace(OLD))
    text = render(records, Checks(True, 1, True, 2))
    names = [re.match(r"[a-z_]+", ln).group(0) for ln in text.splitlines() if ln[0] != "#"]
    order = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    assert len(order) == len(set(order))  # no family split
    for name in set(names):
        assert text.count(f"# TYPE {name} gauge\n") == 1 and text.count(f"# HELP {name} ") == 1
    assert text.endswith("\n") and "\n\n" not in text


HOSTILE = [
    'b9786"} 1\nservefleet_health_ok 1\n#',
    "back\\slash\\",
    'quote"',
    "line\nbreak",
    "nul\x00bell\x07del\x7fnbsp\x85ls\u2028",
    "lone \udc80 surrogate",
    "ünïcödé 模型",
    "x" * 5000,
]


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_label_values_cannot_add_series_or_break_the_file(value):
    """A record's text reaches labels: it is escaped (backslash, quote, newline), control
    characters and lone surrogates become U+FFFD, and the file parses to the same series."""
    rel = dataclasses.replace(NEW, version=value, model_repo=value, perf=GATE)
    text = render(Releases(rel), Checks())
    text.encode("utf-8")  # valid UTF-8, as the format requires
    got = parse(text)
    assert set(got) == {
        "servefleet_records_readable",
        "servefleet_release_info",
        "servefleet_gate_decode_tokens_per_second",
        "servefleet_gate_ttft_seconds",
        "servefleet_gate_measured_timestamp_seconds",
    }
    ((labels, _),) = got["servefleet_release_info"]
    expected = re.sub(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]", "\ufffd", value)
    assert labels["version"] == labels["model"] == expected[:256]


def test_escaping_follows_the_format():
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_the_checks_record_round_trips_and_refuses_what_servefleet_never_writes():
    checks = Checks(True, 1796574607, False, 1796574000)
    assert Checks.loads(checks.dumps()) == checks
    assert Checks.loads("") == Checks()
    for bad in (
        '{"health": {"ok": 1, "at": 5}}',
        '{"health": {"ok": true, "at": -1}}',
        '{"drift": {"in_sync": true, "at": true}}',
        '{"health": {"ok": true, "at": 5, "by": "x"}}',
        '{"other": {}}',
    ):
        with pytest.raises(RecordError):
            Checks.loads(bad)


def test_the_textfile_directory_must_be_roots_alone():
    root = {"type": "directory", "user": "root", "group": "root", "mode": "755"}
    d = "/var/lib/prometheus/node-exporter"
    assert dir_problem("n1", d, root) is None
    assert dir_problem("n1", d, None) is None  # absent: root makes it
    for found in (
        {**root, "user": "servefleet", "group": "servefleet"},
        {**root, "mode": "775"},
        {**root, "mode": "1777"},
        {**root, "type": "symbolic link", "mode": "777"},
    ):
        problem = dir_problem("n1", d, found)
        assert problem.startswith(f"n1: metrics_textfile_dir = {d} is a ")
        assert "expected a directory root owns and only root writes" in problem


def test_the_data_places_the_textfile_directory_apart_from_servefleets_trees():
    data = {"servefleet_root": "/opt/servefleet", "models_root": "/data/models"}
    check = contract.BY_NAME["metrics_textfile_dir"].check
    for ok in ("/var/lib/prometheus/node-exporter", "/var/lib/node_exporter/textfile", None):
        assert check.ok(ok) and metrics_dir_problems({**data, "metrics_textfile_dir": ok}) == []
    for bad in ("var/lib/x", "/var/lib/../tmp", "/var/lib/a b"):
        assert not check.ok(bad)
    for bad in ("/tmp/metrics", "/var/lib", "/opt/servefleet/metrics", "/data/models/m", "/opt"):
        (problem,) = metrics_dir_problems({**data, "metrics_textfile_dir": bad})
        assert problem.startswith(f"key 'metrics_textfile_dir' = {bad!r}")


def test_one_command_writes_the_files_whole_as_root_0644(tmp_path):
    """The write a converge or a verb sends (run here as the node runs it, as root): hostile
    bytes arrive exactly, nothing is left beside them, and no earlier content survives."""
    directory = tmp_path / "node-exporter"
    text = render(Releases(dataclasses.replace(NEW, version=HOSTILE[0] + "'$(touch x)`")), Checks())
    record = tmp_path / "checks.json"
    record.write_text("old")
    files = [(str(record), Checks(True, 5).dumps()), (f"{directory}/servefleet.prom", text)]
    cmd = write_command(str(directory), files)
    subprocess.run(["sh", "-c", cmd.get_raw_value()], check=True, cwd=tmp_path)
    prom = directory / "servefleet.prom"
    assert prom.read_text() == text and Checks.loads(record.read_text()) == Checks(True, 5)
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644 and prom.stat().st_uid == 0
    assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    assert sorted(p.name for p in directory.iterdir()) == ["servefleet.prom"]
    assert not (tmp_path / "x").exists()
