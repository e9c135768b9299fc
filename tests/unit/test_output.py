"""What reaches the operator's terminal: a node's, a hub's or an engine's words are escaped in
one place (core.node_output.shown), in the verbs' tables and wrapped reasons too."""

from __future__ import annotations

from servefleet.cli.output import cut, table, wrap
from servefleet.core.models import HubError


def test_a_table_cell_holding_terminal_escapes_is_printed_escaped():
    text = table(["HOST", "ENGINE"], [["spark-1", "vllm \x1b[2J\x1b]0;owned\x07 0.24.0"]], 80)
    assert "\x1b" not in text and "\x07" not in text
    assert "vllm \\x1b[2J\\x1b]0;owned\\x07 0.24.0" in text


def test_a_reason_with_a_cr_and_a_bidi_override_stays_one_visible_line():
    lines = wrap("failed: x\rservefleet: all healthy \u202eSUCCESS", 200)
    assert lines == ["failed: x\\rservefleet: all healthy \\u202eSUCCESS"]
    assert cut("a\x9bb", 10) == "a\\x9bb"  # C1 CSI, which some terminals obey


def test_a_hub_error_escapes_whatever_the_hub_wrote():
    assert str(HubError("the hub answered HTTP 404 \x1b[31mRepoNotFound")) == (
        "the hub answered HTTP 404 \\x1b[31mRepoNotFound"
    )
