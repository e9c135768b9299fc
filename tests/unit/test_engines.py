"""Engines and node classes are declared once (servefleet/engines/, servefleet/fleet/nodes.py)
and everything else derives from them: the deploys, the inventory's groups (a role is a class
with an engine), the data files and their precedence, the knob contract."""

from pathlib import Path

import pytest

from servefleet.core import groupdata
from servefleet.core.node import usable_memory
from servefleet.engines import ENGINES
from servefleet.engines.llamacpp import logic as llamacpp
from servefleet.fleet import contract, registry
from servefleet.fleet.inventory import FleetError, fleet_groups, load_fleet
from servefleet.fleet.nodes import NODE_CLASSES
from servefleet_dev.testbed.material import load

REPO = Path(__file__).resolve().parents[2]
ENGINE_FILES = [e.name for e in ENGINES]
CLASS_FILES = [n.name for n in NODE_CLASSES]


@pytest.fixture(autouse=True)
def project(monkeypatch):
    monkeypatch.chdir(REPO)


def names(group: str) -> set[str]:
    return {a.name for a in groupdata.assignments(group)}


@pytest.mark.parametrize("engine", ENGINES, ids=lambda e: e.name)
def test_each_engine_has_its_deploy_data_and_template(engine):
    deploy = (REPO / "deploys" / f"{engine.deploy}.py").read_text()
    assert f"engines.{engine.name} import steps" in deploy and ".begin():" in deploy
    assert groupdata.group_file(engine.name).is_file()
    assert engine.template.startswith(f"files/{engine.name}/") and Path(engine.template).is_file()
    own = {k.name for k in engine.knobs if k.scope != contract.TESTBED}
    assert own <= names(engine.name)  # its own knobs: its file (testbed-only ones: testbed_*)


def test_a_knob_whose_default_depends_on_the_engine_is_set_by_every_engine_and_nowhere_else():
    """all.py's service_port 8000 beside llama.cpp's 8080 was an accident waiting: an engine
    that sets none of its own would silently take all.py's."""
    for knob in contract.KNOBS:
        if knob.per_engine:
            for engine in ENGINE_FILES:
                assert knob.name in names(engine), f"group_data/{engine}.py has no {knob.name}"
            for other in ("all", *CLASS_FILES):
                assert knob.name not in names(other), f"{knob.name} in group_data/{other}.py"


def test_node_class_files_hold_hardware_only():
    engine_own = {k.name for e in ENGINES for k in e.knobs}
    per_engine = {k.name for k in contract.KNOBS if k.per_engine}
    for cls in CLASS_FILES:
        assert not names(cls) & (engine_own | per_engine), cls


def test_precedence_is_class_then_engine_then_testbed_then_host(tmp_path, monkeypatch):
    path = tmp_path / "fleet.yml"
    path.write_text(
        "hosts:\n"
        "  - {name: a, role: spark}\n"
        "  - {name: b, role: spark, engine: llamacpp, data: {llamacpp_context: 4096}}\n"
        "  - {name: c, role: rtx4090, engine: vllm}\n"
        "  - {name: d, role: depot}\n"
    )
    monkeypatch.setenv("SERVEFLEET_FLEET", str(path))
    groups = fleet_groups("inventory/fleet.py")
    assert list(groups) == ["spark", "rtx4090", "depot", "vllm", "llamacpp"]
    member = {g: [n for n, _ in hosts] for g, hosts in groups.items()}
    assert member == {
        "spark": ["a", "b"],
        "rtx4090": ["c"],
        "depot": ["d"],
        "vllm": ["a", "c"],
        "llamacpp": ["b"],
    }
    assert [h.engine for h in load_fleet(path)] == ["vllm", "llamacpp", "vllm", None]
    assert list(fleet_groups("inventory/rtx4090.py")) == ["rtx4090", "vllm"]


@pytest.mark.parametrize(
    "entry,problem",
    [
        ("{name: a, role: depot, engine: vllm}", "'engine' = 'vllm': a depot serves no engine"),
        ("{name: a, role: spark, engine: sglang}", "'engine' = 'sglang': expected one of vllm"),
    ],
)
def test_a_wrong_engine_is_one_line(tmp_path, entry, problem):
    path = tmp_path / "fleet.yml"
    path.write_text(f"hosts:\n  - {entry}\n")
    with pytest.raises(FleetError, match=problem):
        load_fleet(path)


def test_roles_are_classes_with_engines():
    assert registry.parse_role("spark")[1].name == "vllm"
    assert registry.parse_role("spark-llamacpp")[1].name == "llamacpp"
    assert registry.parse_role("depot")[1] is None
    with pytest.raises(ValueError, match="rtx4090-vllm"):
        registry.parse_role("depot-vllm")
    assert registry.role_name(["spark", "llamacpp", "testbed"]) == "spark-llamacpp"
    assert registry.role_name(["spark", "vllm"]) == "spark"


def test_a_deploy_acts_on_its_engines_hosts_whatever_their_class():
    assert registry.applies("serve_q4_llamacpp", ["spark", "llamacpp"])
    assert not registry.applies("serve_bf16", ["spark", "llamacpp"])
    assert registry.applies("serve_bf16", ["rtx4090", "vllm"])
    assert registry.applies("serve_bf16", ["spark"])  # the class's own engine
    assert not registry.applies("depot", ["spark"]) and registry.applies("base", ["depot"])


def test_llamacpp_on_a_spark_builds_for_the_gb10():
    data = load("all", "spark", "llamacpp")
    assert llamacpp.cmake_flags(data)["CMAKE_CUDA_ARCHITECTURES"] == "121"
    assert (
        llamacpp.cmake_flags(load("all", "rtx4090", "llamacpp"))["CMAKE_CUDA_ARCHITECTURES"] == "89"
    )
    # the testbed builds for its CPU: no CUDA, no architecture
    testbed = load("all", "spark", "llamacpp", "testbed_llamacpp", "testbed")
    assert "CMAKE_CUDA_ARCHITECTURES" not in llamacpp.cmake_flags(testbed)


def test_vllm_plans_with_the_node_class_memory():
    memory = {"total": 128 * 1024**3, "available": 100 * 1024**3}
    spark, rtx = load("all", "spark", "vllm"), load("all", "rtx4090", "vllm")
    assert usable_memory(spark, memory, []) == 128 * 1024**3  # unified: system memory
    assert usable_memory(rtx, memory, []) == 24 * 1024**3  # discrete: the GPU's 24 GiB
