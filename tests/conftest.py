"""Shared fixtures. The e2e tier runs against the real testbed: its own instance, brought up
fresh once per session (whatever a demo or an earlier run left up is never reused)."""

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

# Before anything imports the testbed: the tests' own instance (namespace, subnet, state), never
# the demo's (instance 0). Parallel workers (pytest-xdist, `-n` in pyproject.toml) each get their
# own: gw0 the base instance, gwN base + 3 + N (8 and 9 belong to test_testbed and benchmarks).
_BASE_INSTANCE = int(os.environ.get("SERVEFLEET_TEST_INSTANCE", "7"))
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_WORKER_INDEX = int(_WORKER[2:]) if _WORKER.startswith("gw") else 0
TEST_INSTANCE = str(_BASE_INSTANCE + (3 + _WORKER_INDEX if _WORKER_INDEX else 0))
os.environ["SERVEFLEET_TESTBED_INSTANCE"] = TEST_INSTANCE

if _WORKER:
    # pyinfra_cli (imported by servefleet) runs gevent's patch_all() on import. In an xdist
    # worker that would turn the Event and queues its I/O thread (a real thread, started
    # before) signals into gevent ones, which a real thread cannot wake: the worker dies "This
    # operation would block forever". Workers run unpatched: the tests drive pyinfra through
    # its CLI in subprocesses, and whatever runs pyinfra in-process still works unpatched
    # (connections one after another instead of side by side).
    from gevent import monkey

    monkey.patch_all = lambda *args, **kwargs: None

import pytest  # noqa: E402

from servefleet.fleet.registry import parse_role  # noqa: E402
from servefleet_dev.testbed import (  # noqa: E402
    hosts as tb_hosts,
    lifecycle,
)
from servefleet_dev.testbed.image import ADMIN_USER  # noqa: E402
from servefleet_dev.testbed.leftovers import leftovers  # noqa: E402
from servefleet_dev.testbed.state import known_hosts_path, load_state  # noqa: E402

SESSION_HOSTS = ["spark-1", "rtx4090-1", "depot-1"]


@pytest.fixture(scope="session")
def testbed():
    """The session's hosts: a fresh testbed, taken down again afterwards."""
    log = lambda m: print(f"[testbed] {m}")  # noqa: E731
    lifecycle.down(log=log)  # hosts an earlier run left up are not fresh
    lifecycle.up(SESSION_HOSTS, log=log)
    try:
        yield load_state()
    finally:
        if not os.environ.get("SERVEFLEET_KEEP_TESTBED"):
            down_and_check(log)


@contextmanager
def hosts_of_their_own(specs: list[str], log):
    """`specs` up on this worker's instance: beside the session's hosts where those run here
    (one worker runs every module), else on a testbed of their own, taken down after them and
    checked for leftovers like the session's."""
    shared = bool(load_state().hosts)
    lifecycle.up(specs, log=log)
    try:
        yield load_state()
    finally:
        if os.environ.get("SERVEFLEET_KEEP_TESTBED"):
            pass
        elif shared:
            for spec in specs:
                name = spec.split("@", 1)[0]
                if name in load_state().hosts:
                    lifecycle.rm(name, log=log)
        else:
            down_and_check(log)


def down_and_check(log) -> None:
    """This instance's testbed down, and nothing of it left running: a test that started
    something that outlived it fails the session (or the module)."""
    inode = load_state().netns_inode
    lifecycle.down(log=log)
    left = leftovers(inode)
    if left:
        raise RuntimeError(f"still running after the testbed went down: {left}")


@pytest.fixture(scope="session")
def ssh_key(testbed):
    return str(tb_hosts.ssh_key())


def testinfra_host(record, key: str, user: str = "root"):
    import testinfra

    return testinfra.get_host(
        f"ssh://{user}@{record.address}:{record.ssh_port}",
        ssh_identity_file=key,
        ssh_extra_args=f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known_hosts_path()} "
        "-o LogLevel=ERROR",
    )


@pytest.fixture
def th(testbed, ssh_key):
    """testinfra host by testbed name, as root (for inspection): th('spark-1')."""
    return lambda name: testinfra_host(load_state().hosts[name], ssh_key)


@pytest.fixture
def fleet_file(testbed, ssh_key, tmp_path):
    """Write an operator-style fleet.yml for testbed hosts: {name: (role, data overrides)},
    reached like a real fleet (the admin with sudo, pinned host keys). A role with an engine
    (spark-llamacpp) is written as fleet.yml writes it: `role: spark`, `engine: llamacpp`."""
    import yaml

    def make(entries: dict) -> str:
        hosts = []
        for name, (role, data) in entries.items():
            rec = load_state().hosts[name]
            cls, engine = parse_role(role)
            hosts.append(
                {
                    "name": name,
                    "role": cls.name,
                    **({"engine": engine.name} if engine and engine.name != cls.engine else {}),
                    "ssh_hostname": rec.address,
                    "ssh_port": rec.ssh_port,
                    "ssh_user": ADMIN_USER,
                    "sudo": True,
                    "ssh_key": ssh_key,
                    "ssh_known_hosts_file": str(known_hosts_path()),
                    "data": data,
                }
            )
        path = tmp_path / "fleet.yml"
        path.write_text(yaml.safe_dump({"hosts": hosts}))
        return str(path)

    return make


# The e2e tier in three parts, each on its own testbed instance in its own worker (`-n 3`,
# pytest_xdist_make_scheduler), balanced by measured time (docs/evidence.md, "Test time"): the
# platforms part (the arm64 guest, Debian 13, the engine combinations) is the shortest, so its
# worker then takes most of the unit and hostile tiers. Each module converges the hosts it needs,
# so a module does not depend on which part ran before it. Within a part, modules run in this
# order; test_zz_teardown, which takes its instance down, comes last in its part.
E2E_PARTS = {
    "e2e-platforms": ["test_arm64", "test_debian13", "test_rtx4090_vllm", "test_spark_llamacpp"],
    "e2e-hosts": [
        "test_testbed",
        "test_node_output",
        "test_base",
        "test_drift",
        "test_models",
        "test_spark",
        "test_security",
        "test_status_bench",
        "test_rebuild",
        "test_demo",
        "test_first_node",
        "test_fleet_report",
        "test_zz_teardown",
    ],
    "e2e-llama": [
        "test_drift_recipes",
        "test_llamacpp",
        "test_rollout",
        "test_prometheus",
    ],
}
_PART_OF = {
    module: (half, pos) for half, modules in E2E_PARTS.items() for pos, module in enumerate(modules)
}


def pytest_collection_modifyitems(config, items):
    """The e2e parts' tests first, each part's modules in their order: each worker starts on one,
    and the unit and hostile tiers go to whichever is free."""

    def key(item):
        module = Path(str(item.fspath)).stem
        if _tier(item.nodeid) != "e2e":
            return (1, "", 0)
        if module not in _PART_OF:
            raise pytest.UsageError(
                f"{item.nodeid}: e2e module not in tests/conftest.py "
                "E2E_PARTS (every e2e module belongs to one part)"
            )
        half, pos = _PART_OF[module]
        return (0, half, pos)

    items.sort(key=key)  # stable: each module keeps its own order


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling, with each e2e part one scope (one worker runs it, in order)
    and every other test a scope of its own (any worker). Not `--dist loadgroup`: it marks
    groups by rewriting node ids, which pytest 9.2's structured node ids no longer allow."""
    from xdist.scheduler import LoadScopeScheduling

    class Halves(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
            if _tier(nodeid) == "e2e" and module in _PART_OF:
                return _PART_OF[module][0]
            return nodeid

    return Halves(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped test counts as not run: it fails, with the reason (./bin/setup installs what
    every test needs; SERVEFLEET_ALLOW_SKIPS=1 for a partial machine, never in CI)."""
    outcome = yield
    rep = outcome.get_result()
    if (
        rep.skipped
        and not hasattr(rep, "wasxfail")
        and not os.environ.get("SERVEFLEET_ALLOW_SKIPS")
    ):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = (
            f"skipped, which counts as not run: {reason} (tests/conftest.py: every "
            f"test runs; ./bin/setup installs what they need)"
        )


_NICED: list = []


def pytest_runtest_setup(item):
    """A worker running the unit or hostile tier beside the e2e parts yields the CPU to them:
    the e2e tier waits on hosts, the unit tier only on the CPU."""
    if _WORKER and _tier(item.nodeid) != "e2e" and not _NICED:
        os.nice(5)
        _NICED.append(True)


_PREFETCH: dict = {}
PREFETCH_LOG = ".pytest-prefetch.log"


def pytest_collection_finish(session):
    """A session that runs the e2e tier and the unit tier: make the unit tier's big things in
    the background meanwhile (servefleet_dev.testing.prefetch; nice'd, same locks). Under
    xdist every worker collects: the first one starts it."""
    tiers = {_tier(item.nodeid) for item in session.items}
    if (
        {"e2e", "unit"} <= tiers
        and _WORKER in ("", "gw0")
        and not os.environ.get("SERVEFLEET_NO_PREFETCH")
    ):
        log = open(Path(session.config.rootpath) / PREFETCH_LOG, "w")
        _PREFETCH["proc"] = subprocess.Popen(
            ["nice", "-n", "5", sys.executable, "-m", "servefleet_dev.testing.prefetch"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        _PREFETCH["log"] = log


def pytest_sessionfinish(session):
    proc = _PREFETCH.get("proc")
    if proc and proc.poll() is None:  # the tests finished first (or were interrupted)
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


TIERS = ("e2e", "hostile", "unit", "other")
_SESSION_START = time.monotonic()
_SESSION_WALL_START = time.time()


def _tier(nodeid: str) -> str:
    parts = nodeid.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else "other"


def pytest_terminal_summary(terminalreporter):
    """Where the time went (per tier, and per e2e part and module: setup + call + teardown of
    its tests) and the hostile-input suite's count: tried, handled, failed."""
    spent = dict.fromkeys(TIERS, 0.0)
    counted = dict.fromkeys(TIERS, 0)
    modules: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for rep in reports:
            if hasattr(rep, "duration") and hasattr(rep, "nodeid") and hasattr(rep, "when"):
                tier = _tier(rep.nodeid)
                spent[tier] += rep.duration
                counted[tier] += rep.when == "call"
                if tier == "e2e":
                    module = rep.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")
                    modules[module] = modules.get(module, 0.0) + rep.duration
    terminalreporter.write_sep(
        "-", "time per tier (workers run side by side: the sum exceeds the wall time)"
    )
    for tier in TIERS:
        if counted[tier] or spent[tier]:
            terminalreporter.write_line(
                f"{tier:8} {counted[tier]:5} tests  {spent[tier] / 60:6.1f} min"
            )
    for half, names in E2E_PARTS.items():
        if any(n in modules for n in names):
            terminalreporter.write_line(
                f"  {half}: {sum(modules.get(n, 0) for n in names) / 60:.1f} min = "
                + ", ".join(
                    f"{n.removeprefix('test_')} {modules.get(n, 0) / 60:.1f}" for n in names
                )
            )
    terminalreporter.write_line(
        f"{'session':8} {'':5}        {(time.monotonic() - _SESSION_START) / 60:6.1f} min (wall)"
    )
    prefetch_log = Path(terminalreporter.config.rootpath) / PREFETCH_LOG
    if prefetch_log.exists() and prefetch_log.stat().st_mtime >= _SESSION_WALL_START:
        for line in prefetch_log.read_text().splitlines():
            if line.startswith("prefetch: "):
                terminalreporter.write_line(line)
    tried = handled = failed = 0
    for key in ("passed", "failed", "error"):
        for rep in terminalreporter.stats.get(key, []):
            if "test_hostile_input[" in getattr(rep, "nodeid", "") and rep.when == "call":
                tried += 1
                handled += key == "passed"
                failed += key != "passed"
    if tried:
        terminalreporter.write_line(
            f"hostile inputs: {tried} tried, {handled} handled, {failed} failed"
        )
