"""The recipes' deep drift checks: pure helpers (diffs, hashes, versions, model, build, service)."""

import os
import subprocess
from pathlib import Path

import pytest

from servefleet.core import drift_items as di
from servefleet.core.layout import NodeLayout
from servefleet.core.models import invalid_record_reason
from servefleet.engines.llamacpp import logic as llamacpp, steps as llama_recipe
from servefleet.engines.llamacpp.logic import Builds
from servefleet.engines.vllm import logic as vllm, readers as vllm_readers, steps as vllm_recipe
from servefleet.engines.vllm.operations.patch import recorded_patch
from servefleet.facts.models import ModelRecordFiles
from servefleet.recipes.service import render_unit
from servefleet.verbs import deep_drift as dc
from servefleet_dev.testbed.material import load

SPARK = load("all", "spark", "vllm", "testbed_vllm", "testbed")
RTX = load("all", "rtx4090", "llamacpp", "testbed_llamacpp", "testbed")
SHA = "0123456789abcdef0123456789abcdef01234567"  # the model revision, resolved to its commit
SPARK_MODEL = NodeLayout.of(SPARK).model_dir(SPARK["model_repo"], SHA)
RTX_MODEL = NodeLayout.of(RTX).model_dir(RTX["model_repo"], SHA)


@pytest.fixture(autouse=True)
def project_dir(monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # files/ resolves against the project


def states(items):
    return {i.name: i.state for i in items}


# --- unit diff ---------------------------------------------------------------------------------


def test_vllm_unit_renders_from_the_recipe_context():
    model = SPARK_MODEL
    text = render_unit(vllm_recipe.UNIT_TEMPLATE, vllm.unit_context(SPARK, SPARK_MODEL))
    assert f"ExecStart={vllm.executable(SPARK)} serve {model} \\\n" in text
    assert f"    --max-model-len {SPARK['max_model_len']} \\\n" in text
    assert "EnvironmentFile" not in text and text.endswith("WantedBy=multi-user.target\n")
    keyed = render_unit(
        vllm_recipe.UNIT_TEMPLATE, vllm.unit_context({**SPARK, "api_key_file": "/k"}, SPARK_MODEL)
    )
    assert "EnvironmentFile=/opt/servefleet/etc/vllm.env" in keyed


def test_llamacpp_unit_renders_with_the_lint_flag():
    ctx = llamacpp.unit_context(RTX, RTX_MODEL, override_kv=lambda: "a.b=int:4")
    text = render_unit(llama_recipe.UNIT_TEMPLATE, ctx)
    args = [line.strip().rstrip("\\").strip() for line in text.splitlines()]
    assert "--override-kv a.b=int:4" in args
    plain = render_unit(
        llama_recipe.UNIT_TEMPLATE, llamacpp.unit_context(RTX, RTX_MODEL, override_kv=lambda: None)
    )
    assert "--override-kv" not in plain


def test_unit_diff_shows_the_changed_lines_with_context():
    rendered = render_unit(vllm_recipe.UNIT_TEMPLATE, vllm.unit_context(SPARK, SPARK_MODEL))
    edited = [line.replace("RestartSec=10", "RestartSec=3") for line in rendered.splitlines()]
    edited.append("# a local note")
    diff = di.unit_diff(rendered, edited, "/etc/systemd/system/x.service")
    lines = diff.splitlines()
    assert "-RestartSec=10" in lines and "+RestartSec=3" in lines and "+# a local note" in lines
    assert " Restart=on-failure" in lines  # one line of context
    assert not any(line.startswith(("---", "+++")) for line in lines)
    assert lines[0].startswith("@@ ")


def test_unit_diff_missing_whitespace_and_truncation():
    assert di.unit_diff("a\n", None, "/u") == "/u is missing"
    assert (
        di.unit_diff("a\nb\n", ["a", "b"], "/u")
        == "/u differs only in whitespace at the end of the file"
    )
    expected = "\n".join(f"line {n}" for n in range(100))
    found = [f"LINE {n}" for n in range(100)]
    diff = di.unit_diff(expected, found, "/u", max_lines=10).splitlines()
    assert (
        len(diff) == 11 and diff[-1].startswith("... (") and diff[-1].endswith("more diff lines)")
    )


def test_sha1_matches_what_files_put_compares():
    assert di.sha1_text("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d"


# --- vLLM: versions and patch ------------------------------------------------------------------


def test_versions_against_pins():
    pins = {"torch": "2.11.0", "vllm": "0.24.0"}
    items = di.version_items(
        "/v", {"torch": "2.11.0+cu130", "vllm": "0.24.0"}, pins, "13.0", "13.0"
    )
    assert set(states(items).values()) == {"in_sync"}
    items = di.version_items("/v", {"torch": "2.11.0", "vllm": "0.26.0"}, pins, "", "13.0")
    by = {i.name: i for i in items}
    assert (
        by["vllm version in /v"].state == "drifted" and by["vllm version in /v"].found == "0.26.0"
    )
    assert by["torch.version.cuda"].found == "None (a CPU build)"
    items = di.version_items("/v", {}, pins, None, "13.0")
    assert [i.found for i in items] == ["not installed", "not installed"]  # no CUDA item


def test_patch_items_name_each_hash():
    rec, new = recorded_patch("0.24.0"), recorded_patch("0.26.0")
    known = vllm_readers.known_hashes()
    ok = vllm_readers.patch_items(
        "0.24.0", True, "/q.py", rec.patched_sha256, rec.pristine_sha256, known
    )
    assert set(states(ok).values()) == {"in_sync"}
    assert ok[0].expected == f"{rec.patched_sha256} (patched for vLLM 0.24.0)"

    reverted = vllm_readers.patch_items("0.24.0", True, "/q.py", rec.pristine_sha256, None, known)
    assert [i.state for i in reverted] == ["drifted", "drifted"]
    assert reverted[0].found == f"{rec.pristine_sha256} (vLLM 0.24.0's own file)"
    assert reverted[1].found == "absent"

    upgraded = vllm_readers.patch_items(
        "0.24.0", True, "/q.py", new.pristine_sha256, rec.pristine_sha256, known
    )
    assert upgraded[0].found == f"{new.pristine_sha256} (vLLM 0.26.0's own file)"
    assert upgraded[1].state == "in_sync"

    bogus = vllm_readers.patch_items("0.24.0", True, "/q.py", rec.patched_sha256, "f" * 64, known)
    assert bogus[1].state == "drifted" and bogus[1].found == f"{'f' * 64} (unknown content)"

    unpatched = vllm_readers.patch_items("0.24.0", False, "/q.py", rec.pristine_sha256, None, known)
    assert set(states(unpatched).values()) == {"in_sync"}
    stale = vllm_readers.patch_items(
        "0.24.0", False, "/q.py", rec.patched_sha256, rec.pristine_sha256, known
    )
    assert [i.state for i in stale] == ["drifted", "drifted"]

    (gone,) = vllm_readers.patch_items("0.24.0", True, None, None, None, known)
    assert gone.state == "drifted" and "no qwen3_5.py in the venv" in gone.found
    (unrecorded,) = vllm_readers.patch_items("0.99.0", True, "/q.py", "a" * 64, None, known)
    assert unrecorded.state == "drifted" and "0.24.0" in unrecorded.found


# --- model -------------------------------------------------------------------------------------

SHA, OTHER = "a" * 40, "b" * 40
RECORD = {
    "repo_id": "org/m",
    "revision": "main",
    "sha": SHA,
    "include": ["*.gguf"],
    "files": {"m.gguf": 10},
}


def test_model_on_a_branch_shows_the_resolved_and_recorded_sha():
    item = di.model_item("org/m", "main", ["*.gguf"], "/d", RECORD, resolved=SHA)
    assert item.state == "in_sync"
    assert item.expected == f"org/m@main = {SHA}" and item.found == f"org/m@main = {SHA}"
    moved = di.model_item("org/m", "main", ["*.gguf"], "/d", RECORD, resolved=OTHER)
    assert moved.state == "drifted" and moved.expected == f"org/m@main = {OTHER}"
    unknown = di.model_item("org/m", "main", ["*.gguf"], "/d", RECORD)  # hub not asked (depot)
    assert unknown.state == "in_sync" and unknown.expected == "org/m@main"
    other_branch = di.model_item("org/m", "dev", ["*.gguf"], "/d", RECORD)
    assert other_branch.state == "drifted"


def test_model_pinned_sha_include_and_invalid_record():
    assert di.model_item("org/m", SHA, ["*.gguf"], "/d", RECORD).state == "in_sync"
    assert di.model_item("org/m", OTHER, ["*.gguf"], "/d", RECORD).state == "drifted"
    wider = di.model_item("org/m", SHA, ["*.gguf", "*.json"], "/d", RECORD)
    assert wider.state == "drifted" and "include" in wider.found
    gone = di.model_item("org/m", SHA, ["*.gguf"], "/d", None, why_invalid="missing: m.gguf")
    assert gone.state == "drifted" and gone.found == "no verified copy (missing: m.gguf)"


def test_invalid_record_reason_names_the_files():
    files = {"a": 1, "b": 2, "c": 3}
    assert (
        invalid_record_reason({"files": files}, {"a": 1, "c": 4}) == "missing: b; size changed: c"
    )
    assert invalid_record_reason(None, {}) == "no record that the model was verified"


def test_model_record_files_fact_reads_every_name_the_shell_lists(tmp_path):
    """The fact's own command in a real shell, its output decoded as pyinfra decodes it
    (strict UTF-8 lines): a name that is not UTF-8 and one holding a newline come back whole."""
    model, record = tmp_path / "m", tmp_path / "record.json"
    model.mkdir()
    record.write_text('{"files": {"a": 1}}')
    for name, body in ((b"a", b"x"), (b"b\xff", b"xy"), (b"c\n10 a", b"z")):
        (model / os.fsdecode(name)).write_bytes(body)
    fact = ModelRecordFiles()
    command = fact.command(path=str(model), record=str(record), user="root")
    out = subprocess.run(["sh", "-c", command], capture_output=True, check=True).stdout
    lines = out.decode("utf-8").splitlines()  # pyinfra's reader: strict
    assert fact.process(lines) == (
        {"files": {"a": 1}},
        {"a": 1, os.fsdecode(b"b\xff"): 2, "c\n10 a": 1},
    )
    assert fact.process([]) == (None, {})


# --- llama.cpp build ---------------------------------------------------------------------------


def test_flags_delta_shows_only_what_differs():
    a = {"X": "ON", "Y": "OFF"}
    assert di.flags_delta(a, a) == ("X=ON Y=OFF", "X=ON Y=OFF")
    assert di.flags_delta({**a, "Z": "1"}, {**a, "X": "OFF"}) == ("X=ON Z=1", "X=OFF Z unset")


def test_build_items():
    name = llamacpp.build_name(RTX)
    root = f"{RTX['servefleet_root']}/llama.cpp"
    record = {"commit": RTX["llamacpp_commit"], "cmake_flags": dict(RTX["llamacpp_cmake_flags"])}
    ok = llamacpp.build_items(RTX, Builds({name: record}, f"{root}/{name}"))
    assert set(states(ok).values()) == {"in_sync"}

    flags = {**RTX["llamacpp_cmake_flags"], "LLAMA_TOOLS_INSTALL": "OFF"}
    wanted = {**RTX, "llamacpp_cmake_flags": flags}
    by = {i.name: i for i in llamacpp.build_items(wanted, Builds({name: record}, f"{root}/{name}"))}
    assert by["llama.cpp current build"].state == "drifted"
    assert by["llama.cpp commit"].state == "in_sync"
    assert (by["llama.cpp CMake flags"].expected, by["llama.cpp CMake flags"].found) == (
        "LLAMA_TOOLS_INSTALL=OFF",
        "LLAMA_TOOLS_INSTALL unset",
    )

    old = {**record, "commit": "c" * 40}
    by = {i.name: i for i in llamacpp.build_items(RTX, Builds({name: old}, f"{root}/{name}"))}
    assert by["llama.cpp commit"].state == "drifted" and by["llama.cpp commit"].found == "c" * 40

    none = llamacpp.build_items(RTX, Builds())
    assert [i.found for i in none] == ["no `current` link", "no build", "no build"]


# --- service and gating ------------------------------------------------------------------------


def test_service_items():
    assert set(states(di.service_items("u", "running", True, True, True)).values()) == {"in_sync"}
    stopped = di.service_items("u", "running", True, False, True)
    assert (stopped[0].name, stopped[0].state, stopped[0].expected, stopped[0].found) == (
        "u active",
        "drifted",
        "running",
        "stopped",
    )
    assert di.service_items("u", "stopped", True, None, True)[0].state == "in_sync"
    assert di.service_items("u", "stopped", True, False, False)[1].found == "disabled"


def test_deep_items_follow_the_hosts_engine_not_an_operation_name():
    """The deploy names its engine, the host's groups name the host's: a serving deploy's deep
    items run on its engine's hosts only, whatever its operations are called."""

    class Host:
        def __init__(self, groups):
            self.groups = groups

    assert dc.deep_items(Host(["rtx4090"]), "serve_bf16") == []
    assert dc.deep_items(Host(["spark", "llamacpp"]), "serve_bf16") == []
    assert dc.deep_items(Host(["spark"]), "base") == []
    assert dc.deep_items(Host(["depot"]), "serve_q4_llamacpp") == []
