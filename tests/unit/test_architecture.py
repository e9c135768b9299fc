"""The architecture, checked: imports go one way (import-linter's layers contract, no cycles),
the product package never imports the dev package, no module is over 400 lines, no import hides
inside a function, and no node path is spelled outside servefleet.core.layout."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCT = REPO / "servefleet"
MODULES = sorted(p for p in PRODUCT.rglob("*.py"))


def test_import_linter_contracts_are_kept():
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "7 kept, 0 broken" in done.stdout


def test_no_import_cycles():
    graph = grimp.build_graph("servefleet", "servefleet_dev")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(imported, module):
                cycles.append(f"{module} <-> {imported}")
    assert not cycles, cycles


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_product_module_is_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= 400


# An import inside a function is allowed only for an optional heavy dependency, said so in a
# comment on its line or the line above ("optional heavy dependency").
MARK = "optional heavy dependency"


@pytest.mark.parametrize(
    "path",
    sorted(MODULES + list((REPO / "servefleet_dev").rglob("*.py"))),
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_no_imports_inside_functions(path):
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)
    found = []
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                    near = " ".join(lines[max(node.lineno - 2, 0) : node.lineno])
                    if MARK not in near:
                        found.append(f"{func.name}: {name}")
    assert not found, found


# Fragments of the node layout: only servefleet/core/layout.py may write them into a string
# (an example in an error message, "e.g. ...", is not a path the code uses).
LAYOUT_FRAGMENTS = (
    "/opt/servefleet",
    "/tools/venv",
    "/venvs/",
    "etc/api-key",
    "vllm.env",
    "state/",
    "releases.json",
    "/llama.cpp/",
    "servefleet/models",
    "/cache/",
    "hf-token",
    "depot-key",
    "depot-home",
    "bin/servefleet",
    "/etc/systemd/system",
)


def _strings(tree):
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            yield node.lineno, node.value


@pytest.mark.parametrize(
    "path", [p for p in MODULES if p.name != "layout.py"], ids=lambda p: str(p.relative_to(REPO))
)
def test_no_node_path_is_built_outside_the_layout(path):
    tree = ast.parse(path.read_text())
    bad = [
        (line, text)
        for line, text in _strings(tree)
        if any(fragment in text for fragment in LAYOUT_FRAGMENTS)
        and not text.lstrip().startswith("#")
        and "e.g." not in text
    ]
    assert not bad, bad


# Engines and roles by name: only their declarations spell them (servefleet/engines/<name>/,
# servefleet/fleet/nodes.py). The verbs, operations, recipes and commands ask the registry
# (servefleet.engines, servefleet.fleet.registry); a knob's name (vllm_version) is data and
# does not count, nor does a docstring.
NAMES = re.compile(r"(?<![\w-])(spark|rtx4090|depot|vllm|llama\.cpp)(?![\w-])", re.IGNORECASE)
GENERIC = [
    p for d in ("verbs", "operations", "recipes", "cli") for p in (PRODUCT / d).rglob("*.py")
]


@pytest.mark.parametrize("path", sorted(GENERIC), ids=lambda p: str(p.relative_to(REPO)))
def test_no_generic_string_names_an_engine_or_a_role(path):
    tree = ast.parse(path.read_text())
    bad = [(line, text) for line, text in _strings(tree) if NAMES.search(text)]
    assert not bad, f"{path.relative_to(REPO)} names an engine or a role: {bad}"


def test_the_string_rule_sees_f_strings_and_skips_knob_names():
    tree = ast.parse('x = f"{a} on vLLM"\ny = "vllm_version"\ndef f():\n    "spark"\n')
    assert [text for _, text in _strings(tree) if NAMES.search(text)] == [" on vLLM"]
