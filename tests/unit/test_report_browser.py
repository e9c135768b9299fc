"""`servefleet report`'s page in a real browser (#30): Debian's Chromium, headless (bin/setup
installs it), takes screenshots of the page and dumps the DOM it built. The charts are drawn
(the series' colours where each node's charts are, at each point's own place in a chart), the
DOM holds one point per measured release, and a node's hostile text stays text in the browser's
own parse."""

from __future__ import annotations

from servefleet.cli.report_svg import BOTTOM, COLOURS, HEIGHT, LEFT, RIGHT, TOP, WIDTH, line_chart
from servefleet.verbs.report import NodeReport
from servefleet.verbs.status import NodeStatus
from tests.unit import report_pages as rp
from tests.unit.browser import bands, charts, chromium, near, screenshot
from tests.unit.report_pages import HOSTILE, Elements, points

PAGE_SIZE = (1280, 2400)


def test_chromium_draws_a_decode_and_a_ttft_chart_for_each_node_with_figures(tmp_path):
    image = screenshot(tmp_path, "fleet.html", rp.page(), PAGE_SIZE)
    decode, ttft = charts(image, COLOURS["decode"]), charts(image, COLOURS["ttft"])
    # gpu-node-1 and gpu-node-2: each a decode chart and a TTFT chart beside it
    assert len(decode) == 2 and len(ttft) == 2, (bands(image, COLOURS["decode"]), ttft)
    for d, t in zip(decode, ttft, strict=True):
        # side by side: both within one chart's plot height
        assert abs((d[0] + d[1]) - (t[0] + t[1])) / 2 < HEIGHT - TOP - BOTTOM
        assert d[3] < PAGE_SIZE[0] / 2 < t[3]  # decode on the left, TTFT on the right
    assert decode[1][0] - decode[0][1] > 150  # two nodes' charts, one under the other


def test_a_fleet_with_no_figures_has_no_chart_drawn(tmp_path):
    node = NodeReport(NodeStatus("gpu-node-1", role="llamacpp", engine="llama.cpp b9785"))
    image = screenshot(tmp_path, "empty.html", rp.page([node]), PAGE_SIZE)
    assert charts(image, COLOURS["decode"]) == [] and charts(image, COLOURS["ttft"]) == []
    assert len(bands(image, COLOURS["decode"])) == 1  # the legend's dot, nothing else


def test_each_point_is_drawn_where_its_figure_puts_it_and_a_gap_where_none_was_measured(
    tmp_path,
):
    values = [165.1, None, 120.0, 159.6]
    labels = [("b9785", "89cd83"), ("b9790", "aaaaaa"), ("b9800", "bbbbbb"), ("b9785", "4910b1")]
    svg = line_chart("decode", "decode tok/s per release", "tok/s", labels, values)
    image = screenshot(tmp_path, "chart.svg", svg, (WIDTH, HEIGHT))
    px = image.load()
    dots = Elements(svg).all("circle", "point")
    assert [d["data-release"] for d in dots] == ["0", "2", "3"]
    for dot in dots:  # the dot's centre, and around it, in the series' colour
        cx, cy = round(float(dot["cx"])), round(float(dot["cy"]))
        for dx, dy in ((0, 0), (-3, 0), (3, 0), (0, -3), (0, 3)):
            assert near(px[cx + dx, cy + dy], COLOURS["decode"]), (dot, px[cx + dx, cy + dy])
    slot = (WIDTH - LEFT - RIGHT) / 4  # release 1 was not measured: no line, no dot in its slot
    column = round(LEFT + 1.5 * slot)
    assert not any(near(px[column, y], COLOURS["decode"]) for y in range(TOP, HEIGHT - BOTTOM))
    # between releases 2 and 3 the line is drawn
    middle = round(LEFT + 3 * slot)
    assert any(near(px[middle, y], COLOURS["decode"]) for y in range(TOP, HEIGHT - BOTTOM))
    # higher is higher: 165.1 above 159.6 above 120.0
    cys = [float(d["cy"]) for d in dots]
    assert cys[0] < cys[2] < cys[1]


def test_the_dom_chromium_builds_has_one_point_per_measured_release(tmp_path):
    source = tmp_path / "fleet.html"
    source.write_text(rp.page())
    dom = Elements(chromium(tmp_path, "--dump-dom", source.as_uri()).stdout)
    assert [a["class"] for a in dom.all("svg", "chart")] == ["chart decode", "chart ttft"] * 2
    assert [[len(s) for s in points(p["d"])] for p in dom.all("path", "series")] == [[2]] * 4
    assert len(dom.all("circle", "point")) == 8
    assert dom.all("script") == [] and dom.all("link") == []


def test_hostile_node_text_stays_text_in_chromiums_own_parse(tmp_path):
    bad = NodeReport(
        NodeStatus("gpu-node-1", role=HOSTILE, engine=HOSTILE, model=HOSTILE, error=None,
                   service=HOSTILE, health=HOSTILE, release=HOSTILE),
        rp.gpu_host("gpu-node-1", "rollout").history,
        HOSTILE,
        last_rollout_error=HOSTILE,
    )  # fmt: skip
    source = tmp_path / "hostile.html"
    source.write_text(rp.page([bad]))
    dom = Elements(chromium(tmp_path, "--dump-dom", source.as_uri()).stdout)
    assert dom.all("script") == [] and dom.all("img") == []
    assert not any(k.startswith("on") for _, a in dom.tags for k in a)
    assert "<script>alert(1)</script>" in " ".join(dom.text)
    assert len(dom.all("svg", "chart")) == 2  # the node's own charts are still there
