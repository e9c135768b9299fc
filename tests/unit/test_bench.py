"""The node-side benchmark script against a real llama-server (CPU host build, tiny GGUF)."""

import json
import subprocess
import sys
from pathlib import Path

from servefleet.verbs.bench import SCRIPT, roofline
from servefleet_dev.testing.llama_build import llama_host_build
from servefleet_dev.testing.tiny_models import GGUF_CLEAN, build_tiny_gguf


def test_roofline_matches_the_field_report():
    # DGX Spark: 273 GB/s, ~3B active params x 2 bytes (BF16) -> 45.5 tok/s; 30.4 tok/s = 0.67.
    top = roofline(273e9, 3e9 * 2)
    assert round(top, 1) == 45.5 and round(30.4 / top, 2) == 0.67
    assert roofline(None, 6e9) is None


def test_stream_bench_measures_a_real_llama_server(tmp_path):
    from tests.unit.test_gguf_server import Server

    model = build_tiny_gguf(tmp_path / "m.gguf", layout=GGUF_CLEAN)
    server = Server(llama_host_build(), model, tmp_path / "server.log", ("-c", "2048"))
    try:
        assert server.healthy, server.log()
        out = subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve().parents[2] / SCRIPT),
                "--url",
                f"http://127.0.0.1:{server.port}",
                "--runs",
                "3",
                "--prompt-tokens",
                "200",
                "--max-tokens",
                "32",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        server.stop()
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert len(result["runs"]) == 3
    for run in result["runs"]:
        # ignore_eos: every request decodes exactly max_tokens; usage came with the stream
        assert run["completion_tokens"] == 32
        assert run["ttft_s"] > 0 and run["decode_tok_s"] > 0
    # the prompt was sized with the server's own tokenizer, plus the chat template around it
    assert 200 <= result["prompt_tokens"] < 400
    assert result["median_decode_tok_s"] == sorted(r["decode_tok_s"] for r in result["runs"])[1]
