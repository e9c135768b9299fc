"""Per-node serving benchmark (`servefleet bench`): the field method, run on each node."""

from dataclasses import dataclass

from servefleet import fleetapi
from servefleet.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "files/bench/stream_bench.py"
REMOTE_SCRIPT = "/tmp/servefleet-stream-bench.py"


@dataclass
class NodeResult:
    host: str
    ok: bool
    error: str | None = None
    prompt_tokens: int | None = None
    median_ttft_s: float | None = None
    median_decode_tok_s: float | None = None
    roofline_tok_s: float | None = None  # memory bandwidth / bytes read per token
    roofline_ratio: float | None = None
    runs: list | None = None


def roofline(bandwidth_bytes_per_s, bytes_per_token) -> float | None:
    """Decode can't beat reading the active weights once per token: bandwidth / bytes."""
    if bandwidth_bytes_per_s and bytes_per_token:
        return bandwidth_bytes_per_s / bytes_per_token
    return None


def bench_host(host, runs: int, prompt_tokens: int, max_tokens: int) -> NodeResult:
    import json
    import shlex

    data = host.data
    address = "127.0.0.1" if data.service_host in ("0.0.0.0", "::") else data.service_host
    if not host.put_file(str(SCRIPT), REMOTE_SCRIPT):
        return NodeResult(host.name, False, "could not upload the bench script")
    args = ["python3", REMOTE_SCRIPT, "--url", f"http://{address}:{data.service_port}",
            "--runs", str(runs), "--prompt-tokens", str(prompt_tokens),
            "--max-tokens", str(max_tokens)]
    if data.get("served_model_name"):
        args += ["--model", data.served_model_name]
    if data.get("api_key_file"):
        args += ["--api-key-file", f"{data.servefleet_root}/etc/api-key"]
    ok, out, err = fleetapi.run(host, " ".join(shlex.quote(a) for a in args))
    if not ok:
        return NodeResult(host.name, False, (err or out).strip().splitlines()[-1:] and
                          (err or out).strip().splitlines()[-1])
    raw = json.loads(out.strip().splitlines()[-1])
    top = roofline(data.get("memory_bandwidth_bytes_per_s"), data.get("bytes_per_token"))
    decode = raw["median_decode_tok_s"]
    return NodeResult(host.name, True, None, raw["prompt_tokens"], raw["median_ttft_s"], decode,
                      top, decode / top if top and decode else None, raw["runs"])


def bench(inventory: str, limit=None, runs=5, prompt_tokens=2048, max_tokens=256):
    with fleetapi.session(inventory, limit) as sess:
        results = sess.each(lambda h: bench_host(h, runs, prompt_tokens, max_tokens))
        out = [NodeResult(n, False, why) for n, why in sess.unreachable.items()]
        for name, res in results.items():
            out.append(res if isinstance(res, NodeResult)
                       else NodeResult(name, False, f"{type(res).__name__}: {res}"))
    return sorted(out, key=lambda r: r.host)
