"""The rollout's planner (`--batch N` / `--batch P%`) and its exit codes, as an operator reads
them: which hosts go together, in inventory order, and what the run's status says."""

import pytest

from servefleet.core.errors import DataError, Exit
from servefleet.verbs.rollout_report import (
    ATTENTION,
    ROLLED_BACK,
    UNCHANGED,
    UNTOUCHED,
    UPGRADED,
    HostRollout,
    RolloutReport,
    batches,
)

HOSTS = [f"rtx-{i}" for i in range(1, 8)]  # seven hosts


@pytest.mark.parametrize(
    "batch, sizes",
    [
        ("1", [1] * 7),
        ("3", [3, 3, 1]),
        ("7", [7]),
        ("50", [7]),
        ("25%", [2, 2, 2, 1]),  # 25 % of 7 is 1.75: rounded up
        ("10%", [1] * 7),  # 0.7 host: at least one
        ("100%", [7]),
        (" 50% ", [4, 3]),
    ],
)
def test_batches_keep_inventory_order_and_round_up(batch, sizes):
    groups = batches(HOSTS, batch)
    assert [len(g) for g in groups] == sizes
    assert [h for g in groups for h in g] == HOSTS


@pytest.mark.parametrize(
    "batch",
    ["0", "-2", "two", "%", "x%", "", "inf%", "1e400%", "0%", "101%", "-50%", "1.5", "\uff12"],
)
def test_a_bad_batch_is_refused_with_what_is_expected(batch):
    with pytest.raises(DataError, match="--batch"):
        batches(HOSTS, batch)


def report(*results: str) -> RolloutReport:
    r = RolloutReport("test")
    for i, result in enumerate(results):
        r.hosts[f"h{i}"] = HostRollout(f"h{i}", result=result)
    return r


@pytest.mark.parametrize(
    "results, code",
    [
        ((UPGRADED, UPGRADED), Exit.OK),
        ((UNCHANGED, UPGRADED), Exit.OK),  # the data asked for what one host serves already
        ((UNCHANGED,), Exit.OK),
        ((UPGRADED, ROLLED_BACK), Exit.DIFFERS),
        ((UPGRADED, UNTOUCHED), Exit.DIFFERS),  # --max-failures stopped it: the rest untouched
        ((ROLLED_BACK, ATTENTION), Exit.NEEDS_ATTENTION),
        ((), Exit.DIFFERS),  # nothing rolled out is not success
    ],
)
def test_the_exit_code_says_the_worst_outcome(results, code):
    assert report(*results).exit_code == code


def test_a_refusal_keeps_its_own_code():
    r = report(UPGRADED)
    r.refused = Exit.UNREACHABLE
    assert r.exit_code == Exit.UNREACHABLE and r.to_dict()["exit_code"] == 3
