#!/usr/bin/env python3
"""Device-side steps of tests/device/vllm_cuda_probe.sh (read that first): the real vLLM 0.24.0
on a GPU machine, serving the tiny checkpoint with the argv servefleet renders.

Runs with the machine's python3 (3.12, torch, transformers). Each step keeps its state under
/root (SF_PROBE_STATE, default /root/sfprobe), so the steps can be spread over several calls
while the machine is held:

    stage          move the carried payload chunks (.devrun/cNN/payload.tar.partNN) into the
                   stage dir, each checked against its manifest; once every part is there, start
                   `install` in the background (setsid: it outlives the call)
    install        wait for the background install, or run it: payload sha256, untar, the
                   wheels' sha256, `pip install --no-index --no-deps --no-compile --target`
                   (vLLM and its closure -> /root/site; pyinfra's closure -> /root/sfsite, only
                   for rendering with servefleet's own code), the recorded qwen3_5.py patch, the
                   tiny checkpoint + tokenizer, and its config.json against the fixtures
    help           `vllm serve --help=all` (COLUMNS=80) into $OUT/serve-help-0.24.0.txt
    serve LEN POOL the argv servefleet renders for the spark recipe (group_data all + spark +
                   testbed_vllm, max_model_len/kv pool/model dir/port substituted), plus the two
                   probe-only additions; /health, health.py as the recipe runs it (but --unit ''
                   and --log-file: no systemd here), stream_bench.py, stop, summary JSON
    render LEN POOL  only print what `serve` would run (needs /root/sfsite or a local venv)
    collect        all results so far (and llama_b9785_probe.sh's, with the whole build log)
                   as one $OUT/sfprobe-results.tar.gz
    status         what is staged / installed / running

Rendering imports servefleet from this checkout. servefleet.core.systemd (used by
servefleet.engines.vllm.logic) and servefleet.operations.health import pyinfra at module level, and the
GPU image has no pyinfra: the payload carries the real wheels of pyinfra 3.10.0 and its
dependencies (the versions of the project's venv) and `render` runs in its own process with
only those on its path, so the project's code runs unmodified. One substitution: health.argv
reads the checkpoint's config.json through a pyinfra fact (read_json_on_node); here the
probe is the node, so that one function is replaced by a local read of the same file.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("SF_PROBE_STATE", "/root/sfprobe"))
STAGE = STATE / "stage"
RESULTS = STATE / "results"
SITE = Path(os.environ.get("SF_PROBE_SITE", "/root/site"))
SFSITE = Path(os.environ.get("SF_PROBE_SFSITE", "/root/sfsite"))
TINY = Path(os.environ.get("SF_PROBE_TINY", "/root/tiny"))
OUT = Path(os.environ.get("OUT") or STATE / "out")
PY = os.environ.get("PYTHON", "python3")
# tests/device/llama_b9785_probe.sh's results, packed by `collect` too.
LLAMA_WORK = os.environ.get("LLAMA_WORK", "/root/llama")
LLAMA_BUILD_LOG = os.environ.get("LLAMA_BUILD_LOG", "/root/llama-build.log")

VLLM_VERSION = "0.24.0"
GROUPS = ("all", "spark", "vllm", "testbed_vllm")  # applied in this order, as pyinfra does
FIXTURES = REPO / "tests" / "fixtures" / "h200" / "vllm" / "index.json"
HEALTH = REPO / "files" / "health" / "health.py"
BENCH = REPO / "files" / "bench" / "stream_bench.py"
APPLIER = REPO / "files" / "patches" / "vllm" / "apply_patch.py"
MODEL_FILE = "vllm/model_executor/models/qwen3_5.py"

# Not recipe arguments: what this GPU image needs because the payload carries no FlashInfer
# (shared/gpu-probe/README.md, "Obstacles"). A servefleet venv has FlashInfer from vLLM's own
# requirements and runs without these.
PROBE_ONLY_ENV = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
PROBE_ONLY_ARGS = ["--gdn-prefill-backend", "triton"]
# The unit's Environment= entries the probe cannot use as they are: there is no servefleet
# venv here (vLLM runs from /root/site with this python3 and PYTHONPATH).
DROPPED_UNIT_ENV = ("VIRTUAL_ENV", "PATH")

KV_LINE = re.compile(
    r"GPU KV cache size|Maximum concurrency|attention block size|"
    r"Padding mamba page|kv_cache_memory_bytes|Available KV cache|"
    r"Using .*backend|Following weights|Traceback|Error|error:|"
    r"Loading weights took|Model loading took|init engine|torch.compile|"
    r"CUDA graph|language.model.only|for vit attention|visual"
)


PROGRESS = re.compile(r"\d+/\d+ \[[^\]]*(it/s|s/it)\]")  # tqdm bars (CUDA graph capture)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2) + "\n")


def to_out(*paths: Path) -> None:
    """Copy results into $OUT (what comes back from the call; at most 8 files there)."""
    OUT.mkdir(parents=True, exist_ok=True)
    for path in paths:
        if path.is_file():
            shutil.copy2(path, OUT / path.name)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# --- stage ---------------------------------------------------------------------------------------


def read_manifest(path: Path) -> dict:
    """payload.manifest: `<sha256>  payload.tar`, `parts N`, then `<sha256>  payload.tar.partNN`."""
    lines = path.read_text().split("\n")
    tar_sha = lines[0].split()[0]
    count = int(lines[1].split()[1])
    parts = dict(reversed(line.split()) for line in lines[2:] if line.strip())
    if len(parts) != count:
        raise SystemExit(f"{path}: {len(parts)} part digests for {count} parts")
    return {"tar_sha256": tar_sha, "parts": parts}


def staged(manifest: dict) -> tuple[list[str], list[str]]:
    have = [p for p in sorted(manifest["parts"]) if (STAGE / p).is_file()]
    return have, [p for p in sorted(manifest["parts"]) if p not in have]


def cmd_stage(args) -> int:
    STAGE.mkdir(parents=True, exist_ok=True)
    found = sorted(glob.glob(str(REPO / ".devrun" / "c*" / "payload.tar.part*")))
    if not found:
        log("no .devrun/cNN/payload.tar.partNN in this call's tree (carry one: .devrun/cNN)")
    for name in found:
        part = Path(name)
        manifest_file = part.parent / "payload.manifest"
        manifest = read_manifest(manifest_file)
        staged_manifest = STAGE / "payload.manifest"
        if staged_manifest.exists() and staged_manifest.read_text() != manifest_file.read_text():
            log(
                f"{manifest_file} differs from the staged manifest: another payload; "
                f"remove {STAGE} first"
            )
            return 3
        shutil.copyfile(manifest_file, staged_manifest)
        want = manifest["parts"].get(part.name)
        got = sha256_file(part)
        if got != want:
            log(f"{part.name}: sha256 {got} is not the manifest's {want}: not staged")
            return 3
        shutil.move(str(part), STAGE / part.name)
        log(f"staged {part.name} ({(STAGE / part.name).stat().st_size:,} B, sha256 ok)")
    if not (STAGE / "payload.manifest").exists():
        return 1
    have, missing = staged(read_manifest(STAGE / "payload.manifest"))
    log(f"staged parts: {', '.join(have) or 'none'}; missing: {', '.join(missing) or 'none'}")
    log(f"free under /root: {shutil.disk_usage('/root').free / 2**30:.1f} GiB")
    if not missing and args.auto_install:
        start_background_install()
    return 0


def start_background_install() -> None:
    if (STATE / "install.done").exists():
        log("already installed")
        return
    pid_file = STATE / "install.pid"
    if pid_file.exists() and alive(int(pid_file.read_text())):
        log(f"install already running (pid {pid_file.read_text().strip()})")
        return
    logf = open(STATE / "install.log", "ab")
    proc = subprocess.Popen(
        [PY, str(Path(__file__).resolve()), "install", "--foreground"],
        stdout=logf,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    pid_file.write_text(str(proc.pid))
    log(
        f"all parts staged: install started in the background (pid {proc.pid}, log "
        f"{STATE / 'install.log'}); `vllm_cuda_probe.sh install` waits for it"
    )


# --- install -------------------------------------------------------------------------------------


def run(
    cmd: list[str], env: dict | None = None, check: bool = True, **kw
) -> subprocess.CompletedProcess:
    text = " ".join(shlex.quote(str(c)) for c in cmd)
    log("$ " + (text if len(text) <= 400 else text[:400] + f" ... ({len(cmd)} words)"))
    res = subprocess.run([str(c) for c in cmd], env=env, text=True, capture_output=True, **kw)
    for line in (res.stdout + res.stderr).splitlines()[-15:]:
        print("    " + line)
    if check and res.returncode != 0:
        raise SystemExit(f"failed (rc {res.returncode}): {cmd[:4]}")
    return res


def site_env(*paths: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    return env


def cmd_install(args) -> int:
    done = STATE / "install.done"
    pid_file = STATE / "install.pid"
    if not args.foreground:
        if done.exists():
            log("installed already")
            print((STATE / "install.json").read_text())
            to_out(STATE / "install.json")
            return 0
        if pid_file.exists() and alive(int(pid_file.read_text())):
            pid = int(pid_file.read_text())
            log(f"waiting for the background install (pid {pid}), at most {args.wait} s")
            deadline = time.monotonic() + args.wait
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(2)
            print((STATE / "install.log").read_text()[-6000:])
            to_out(STATE / "install.log", STATE / "install.json")
            if alive(pid):
                log("still installing: run `install` again")
                return 2
            return 0 if done.exists() else 1
    t0 = time.monotonic()
    record: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    manifest = read_manifest(STAGE / "payload.manifest")
    have, missing = staged(manifest)
    if missing:
        log(f"missing parts: {', '.join(missing)}")
        return 1

    # 1. The payload tar: its sha256 (manifest and, when carried, .devrun/payload.sha256).
    digest = hashlib.sha256()
    for part in have:
        with open(STAGE / part, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    record["payload_sha256"] = digest.hexdigest()
    if digest.hexdigest() != manifest["tar_sha256"]:
        raise SystemExit(f"payload sha256 {digest.hexdigest()} != {manifest['tar_sha256']}")
    pinned = REPO / ".devrun" / "payload.sha256"
    if pinned.exists() and pinned.read_text().split()[0] != digest.hexdigest():
        raise SystemExit(f"payload sha256 {digest.hexdigest()} != {pinned}")
    log(f"payload.tar sha256 {digest.hexdigest()} ok ({len(have)} parts)")
    extract = STAGE / "x"
    shutil.rmtree(extract, ignore_errors=True)
    extract.mkdir()
    cat = subprocess.Popen(["cat", *[str(STAGE / p) for p in have]], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(extract)], stdin=cat.stdout, check=True)
    if cat.wait() != 0:
        raise SystemExit("cat failed")
    payload = extract / "payload"
    run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=payload)
    log(f"untarred and every wheel's sha256 checked ({time.monotonic() - t0:.0f} s)")

    # 2. The wheels: vLLM's closure for the server, pyinfra's for rendering (kept apart).
    pip = [
        PY,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--disable-pip-version-check",
    ]
    vllm_wheels = sorted(glob.glob(str(payload / "vllm" / "*.whl")))
    shared = [str(payload / "vllm" / n) for n in (payload / "sf" / "SHARED").read_text().split()]
    sf_wheels = sorted(glob.glob(str(payload / "sf" / "*.whl"))) + shared
    for target, wheels in ((SITE, vllm_wheels), (SFSITE, sf_wheels)):
        shutil.rmtree(target, ignore_errors=True)
        run([*pip, "--target", str(target), *wheels])
    record["wheels"] = {"site": len(vllm_wheels), "sfsite": len(sf_wheels)}
    log(f"pip installs done ({time.monotonic() - t0:.0f} s)")
    if os.environ.get("SF_PROBE_NO_GPU"):  # the CPU-only rehearsal (no torch): skip the import
        record["versions"] = {"vllm": VLLM_VERSION, "note": "SF_PROBE_NO_GPU: not imported"}
    else:
        res = run(
            [
                PY,
                "-c",
                "import json, torch, transformers, tokenizers, triton, vllm, numpy; "
                "print(json.dumps({'vllm': vllm.__version__, 'vllm_file': vllm.__file__, "
                "'torch': torch.__version__, 'cuda': torch.version.cuda, "
                "'transformers': transformers.__version__, "
                "'tokenizers': tokenizers.__version__, 'triton': triton.__version__, "
                "'numpy': numpy.__version__, 'gpu': torch.cuda.get_device_name(0) "
                "if torch.cuda.is_available() else None}))",
            ],
            env=site_env(SITE),
        )
        record["versions"] = json.loads(res.stdout.strip().splitlines()[-1])
    if record["versions"]["vllm"] != VLLM_VERSION:
        raise SystemExit(f"vllm {record['versions']['vllm']} imported, not {VLLM_VERSION}")

    # 3. The recorded patch (servefleet.engines.vllm.operations.patch.recorded_patch), applied by the
    #    node-side applier with the same argv the operation runs on a node.
    res = run(
        [PY, str(Path(__file__).resolve()), "patch-info"], env=site_env(SFSITE, REPO), cwd=REPO
    )
    patch = json.loads(res.stdout.strip().splitlines()[-1])
    target = SITE / MODEL_FILE
    before = sha256_file(target)
    record["qwen3_5_installed_sha256"] = before
    if before == patch["pristine_sha256"]:
        run(
            [
                PY,
                APPLIER,
                target,
                REPO / patch["patch_file"],
                patch["pristine_sha256"],
                patch["patched_sha256"],
            ],
            cwd=REPO,
        )
    elif before != patch["patched_sha256"]:
        raise SystemExit(
            f"{target}: sha256 {before} is neither the pristine "
            f"{patch['pristine_sha256']} nor the patched {patch['patched_sha256']}"
        )
    after = sha256_file(target)
    record["qwen3_5_patched_sha256"] = after
    record["qwen3_5_orig_sha256"] = sha256_file(Path(f"{target}.orig"))
    if (
        after != patch["patched_sha256"]
        or record["qwen3_5_orig_sha256"] != patch["pristine_sha256"]
    ):
        raise SystemExit(f"patch result {after} / .orig {record['qwen3_5_orig_sha256']} unexpected")
    record["patch"] = patch
    log(f"qwen3_5.py {before[:12]}… -> {after[:12]}… (recorded pristine -> patched)")

    # 4. The tiny checkpoint (no visual.*, no mtp.*) and its tokenizer + chat template.
    shutil.rmtree(TINY, ignore_errors=True)
    run(
        [
            PY,
            "-c",
            "import sys; from servefleet_dev.testing.tiny_models import build_tiny_checkpoint; "
            "from servefleet_dev.testing.tiny_tokenizer import write_tiny_tokenizer; "
            "build_tiny_checkpoint(sys.argv[1], visual=False, mtp=False); write_tiny_tokenizer(sys.argv[1])",
            TINY,
        ],
        env=site_env(REPO),
        cwd=REPO,
    )
    record["tiny"] = {p.name: sha256_file(p) for p in sorted(TINY.iterdir())}
    fixture = json.loads(FIXTURES.read_text())
    wanted = {
        r["config_sha256"] for r in fixture["recordings"] if r["vllm_version"] == VLLM_VERSION
    }
    record["config_matches_fixtures"] = record["tiny"]["config.json"] in wanted
    if not record["config_matches_fixtures"]:
        raise SystemExit(
            f"config.json sha256 {record['tiny']['config.json']} is not the "
            f"fixtures' {sorted(wanted)}"
        )
    res = run(
        [
            PY,
            "-c",
            "import sys, json; from transformers import AutoTokenizer; "
            "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "m = [{'role': 'user', 'content': 'Say hello in one word.'}]; "
            "print(json.dumps({'len': len(t), 'eos': t.eos_token_id, 'chat': "
            "t.apply_chat_template(m, tokenize=False, add_generation_prompt=True)}))",
            TINY,
        ],
        env=site_env(SITE),
    )
    record["tokenizer"] = json.loads(res.stdout.strip().splitlines()[-1])
    if record["tokenizer"]["len"] != 512 or record["tokenizer"]["eos"] != 511:
        raise SystemExit(f"tokenizer: {record['tokenizer']}")
    record["seconds"] = round(time.monotonic() - t0, 1)
    write_json(STATE / "install.json", record)
    write_json(RESULTS / "install.json", record)
    done.write_text("ok\n")
    shutil.rmtree(extract, ignore_errors=True)  # the wheels are installed; keep the parts
    log(f"installed in {record['seconds']} s: {json.dumps(record['versions'])}")
    to_out(STATE / "install.json")
    return 0


def cmd_patch_info(args) -> int:
    """(sfsite + repo on the path, cwd = repo) the patch servefleet records for VLLM_VERSION."""
    from servefleet.engines.vllm.operations import patch as vllm_patch

    rec = vllm_patch.recorded_patch(VLLM_VERSION)
    if rec is None:
        raise SystemExit(f"no recorded patch for vLLM {VLLM_VERSION}")
    print(
        json.dumps(
            {
                "version": rec.version,
                "patch_file": str(rec.patch_file),
                "pristine_sha256": rec.pristine_sha256,
                "patched_sha256": rec.patched_sha256,
            }
        )
    )
    return 0


# --- help ----------------------------------------------------------------------------------------


def cmd_help(args) -> int:
    require_installed()
    dest = RESULTS / f"serve-help-{VLLM_VERSION}.txt"
    dest.parent.mkdir(parents=True, exist_ok=True)
    env = site_env(SITE)
    env["COLUMNS"] = "80"
    cmd = [PY, "-m", "vllm.entrypoints.cli.main", "serve", "--help=all"]
    log("$ COLUMNS=80 " + " ".join(cmd) + f" > {dest}")
    t0 = time.monotonic()
    with open(dest, "w") as handle:
        res = subprocess.run(
            cmd, env=env, stdout=handle, stderr=subprocess.PIPE, text=True, timeout=300
        )
    log(
        f"rc {res.returncode} in {time.monotonic() - t0:.0f} s, {dest.stat().st_size:,} B, "
        f"{sum(1 for _ in open(dest))} lines; stderr tail:"
    )
    for line in res.stderr.splitlines()[-8:]:
        print("    " + line)
    to_out(dest)
    return res.returncode


def require_installed() -> None:
    if not (STATE / "install.done").exists():
        raise SystemExit("not installed yet: run `vllm_cuda_probe.sh install` first")


# --- render (in its own process: sfsite + this checkout on the path) -----------------------------


def unit_env(entries: list[str]) -> dict:
    """servefleet.core.systemd.environment's quoted "NAME=value" back to NAME, value."""
    out = {}
    for entry in entries:
        text = entry[1:-1] if entry.startswith('"') and entry.endswith('"') else entry
        text = re.sub(r"\\(.)", r"\1", text).replace("%%", "%")
        name, _, value = text.partition("=")
        out[name] = value
    return out


def cmd_render(args) -> int:
    os.chdir(REPO)  # pyinfra resolves files/ and group_data/ against the project
    from servefleet.core.groupdata import load_group
    from servefleet.core.layout import NodeLayout, api_url
    from servefleet.engines.vllm import logic
    from servefleet.engines.vllm.logic import kvplan
    from servefleet.operations import health as health_ops

    data: dict = {}
    for group in GROUPS:
        data.update(load_group(group, REPO) or {})
    merged = {
        k: data.get(k)
        for k in (
            "max_model_len",
            "kv_cache_memory_bytes",
            "service_port",
            "served_model_name",
            "vllm_version",
            "health_timeout_s",
            "health_settle_s",
            "kv_block_alignment",
        )
    }
    overrides = {
        "max_model_len": args.max_model_len,
        "kv_cache_memory_bytes": args.kv_bytes,
        "service_port": args.port,
    }
    data.update(overrides)
    model = str(args.model)
    serve = logic.serve_args(data, model)
    ctx = logic.unit_context(data, model)
    env = unit_env(ctx["environment"])

    # The recipe's health gate (servefleet.engines.vllm.steps.gate_args -> operations.health.argv).
    # read_json_on_node reads the node's config.json through a pyinfra fact; this is the node.
    health_ops.read_json_on_node = lambda path, user=None: json.loads(Path(path).read_text())
    python = data["python_interpreter"]["ubuntu"]
    lay = NodeLayout.of(data)
    health = health_ops.argv(
        str(HEALTH),
        python,
        api_url(data),
        data["served_model_name"],
        logic.UNIT,
        key_file=lay.api_key_file if data.get("api_key_file") else None,
        timeout_s=data["health_timeout_s"],
        settle_s=data["health_settle_s"],
        expect_stopped=data["service_state"] != "running",
        kv_config=f"{model}/config.json",
        kv_data={
            k: data[k] for k in ("max_model_len", "kv_cache_memory_bytes", "kv_block_alignment")
        },
        engine_version=data["vllm_version"],
    )
    # servefleet.verbs.bench.bench_host's argv (runs/sizes: the probe's, smaller than the CLI's).
    bench = [
        python,
        "-I",
        str(BENCH),
        "--url",
        api_url(data),
        "--runs",
        str(args.bench_runs),
        "--prompt-tokens",
        str(args.bench_prompt_tokens),
        "--max-tokens",
        str(args.bench_max_tokens),
    ]
    if data.get("served_model_name"):
        bench += ["--model", data["served_model_name"]]

    config = kvplan.load_config(f"{model}/config.json")
    plan = kvplan.plan_kv(
        config,
        data["max_model_len"],
        data["kv_cache_memory_bytes"],
        block_alignment=data["kv_block_alignment"],
    )
    expectation = logic.kv_expectation(config, data)
    fixture = [
        r
        for r in json.loads(FIXTURES.read_text())["recordings"]
        if r["vllm_version"] == data["vllm_version"]
        and r["max_model_len"] == data["max_model_len"]
        and r["kv_cache_memory_bytes"] == data["kv_cache_memory_bytes"]
    ]
    print(
        json.dumps(
            {
                "groups": list(GROUPS),
                "merged_data": merged,
                "overrides": overrides,
                "model": model,
                "url": api_url(data),
                "served_model_name": data["served_model_name"],
                "vllm_version": data["vllm_version"],
                "vllm_patch": data["vllm_patch"],
                "serve_args": serve,
                "unit_exec_start": ctx["exec_start"],
                "recipe_executable": logic.executable(data),
                "unit_env": env,
                "health_argv": health,
                "bench_argv": bench,
                "plan_kv": {
                    **plan.as_dict(),
                    "page_bytes": plan.page_bytes,
                    "mamba_padding_bytes": plan.mamba_padding_bytes,
                    "group_size": plan.group_size,
                    "blocks_per_request": plan.blocks_per_request,
                    "max_concurrency_2dp": f"{plan.max_concurrency:.2f}",
                },
                "kv_expectation": expectation,
                "kv_compared": logic.kv_compared(data["vllm_version"]),
                "fixture_recording": fixture[0] if fixture else None,
            }
        )
    )
    return 0


def render(args) -> dict:
    cmd = [
        PY,
        str(Path(__file__).resolve()),
        "render",
        str(args.max_model_len),
        str(args.kv_bytes),
        "--model",
        str(args.model),
        "--port",
        str(args.port),
        "--bench-runs",
        str(args.bench_runs),
        "--bench-prompt-tokens",
        str(args.bench_prompt_tokens),
        "--bench-max-tokens",
        str(args.bench_max_tokens),
    ]
    paths = [p for p in (SFSITE, REPO) if p.exists()]
    res = subprocess.run(cmd, env=site_env(*paths), capture_output=True, text=True, cwd=REPO)
    if res.returncode != 0:
        print(res.stderr[-4000:])
        raise SystemExit("render failed")
    return json.loads(res.stdout.strip().splitlines()[-1])


# --- serve ---------------------------------------------------------------------------------------


def stop_server() -> None:
    """End the process group this probe started (its recorded pgid) and nothing else."""
    pgid_file = STATE / "server.pgid"
    if not pgid_file.exists():
        return
    pgid = int(pgid_file.read_text())
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        pgid_file.unlink()
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.5)
    else:
        log(f"server group {pgid} still there after 30 s: SIGKILL")
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        time.sleep(2)
    pgid_file.unlink()
    log(f"server process group {pgid} stopped")


def wait_health(url: str, proc: subprocess.Popen, deadline_s: float) -> tuple[bool, float, str]:
    t0 = time.monotonic()
    last = ""
    while time.monotonic() - t0 < deadline_s:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return True, time.monotonic() - t0, "200"
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))[:120]
        if proc.poll() is not None:
            return False, time.monotonic() - t0, f"server exited rc {proc.returncode} ({last})"
        time.sleep(2)
    return False, time.monotonic() - t0, f"no /health 200 after {deadline_s:.0f} s ({last})"


def gpu_memory() -> str | None:
    try:
        return subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def last_json(text: str):
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def cmd_serve(args) -> int:
    require_installed()
    stop_server()  # a server an earlier, interrupted call left
    r = render(args)
    tag = str(args.max_model_len)
    engine_log = RESULTS / f"vllm-{tag}.log"
    summary_file = RESULTS / f"serve-{tag}.json"
    engine_log.parent.mkdir(parents=True, exist_ok=True)

    # SF_PROBE_ENGINE: the CPU rehearsal only (the testbed's engine stand-in in vLLM's place).
    engine = shlex.split(os.environ.get("SF_PROBE_ENGINE", "")) or [
        PY,
        "-m",
        "vllm.entrypoints.cli.main",
    ]
    argv = [*engine, *r["serve_args"], *PROBE_ONLY_ARGS]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    unit_env_used = {k: v for k, v in r["unit_env"].items() if k not in DROPPED_UNIT_ENV}
    env.update(unit_env_used)
    env.update(PROBE_ONLY_ENV)
    env["PYTHONPATH"] = str(SITE)
    for key in ("HOME", "XDG_CACHE_HOME", "VLLM_CACHE_ROOT", "HF_HOME"):
        if unit_env_used.get(key):
            Path(unit_env_used[key]).mkdir(parents=True, exist_ok=True)
    summary: dict = {
        "run": f"{args.max_model_len} / {args.kv_bytes}",
        "rendered": r,
        "argv": argv,
        "argv_note": (
            "the unit's executable (the venv's `vllm`; on testbed data the engine "
            "stand-in) is here python3 -m vllm.entrypoints.cli.main, the real wheel's "
            "console-script entry point; then servefleet.engines.vllm.logic.serve_args as "
            "rendered, then the probe-only arguments"
        ),
        "engine_override": os.environ.get("SF_PROBE_ENGINE"),
        "probe_only": {
            "env": PROBE_ONLY_ENV,
            "args": PROBE_ONLY_ARGS,
            "why": "no FlashInfer in the payload (shared/gpu-probe/README.md)",
        },
        "env_from_unit": unit_env_used,
        "env_dropped": {k: r["unit_env"].get(k) for k in DROPPED_UNIT_ENV},
        "env_probe": {"PYTHONPATH": str(SITE)},
    }
    log(
        "SERVE: "
        + " ".join(f"{k}={v}" for k, v in {**PROBE_ONLY_ENV, **unit_env_used}.items())
        + " "
        + " ".join(shlex.quote(a) for a in argv)
    )
    t0 = time.monotonic()
    with open(engine_log, "wb") as handle:
        proc = subprocess.Popen(
            argv,
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=unit_env_used.get("HOME"),
            start_new_session=True,
        )
    (STATE / "server.pgid").write_text(str(proc.pid))
    try:
        ok, waited, why = wait_health(r["url"], proc, args.deadline)
        summary["health_wait"] = {"ok": ok, "seconds": round(waited, 1), "detail": why}
        log(f"/health: {why} after {waited:.0f} s")
        if ok:
            summary["gpu_memory_used_total"] = gpu_memory()
            health = list(r["health_argv"])
            unit_at = health.index("--unit") + 1
            summary["health_argv_rendered"] = list(health)
            health[unit_at] = ""  # no systemd here: health.py's own no-unit mode
            health += ["--log-file", str(engine_log)]
            summary["health_argv_run"] = health
            log("$ " + " ".join(shlex.quote(a) for a in health))
            res = subprocess.run(health, capture_output=True, text=True, timeout=420)
            summary["health"] = {
                "rc": res.returncode,
                "report": last_json(res.stdout),
                "stderr": res.stderr[-2000:],
            }
            log(f"health.py rc {res.returncode}: {res.stdout.strip()[-1500:]}")
            if res.stderr.strip():
                print(res.stderr[-1500:])
            if args.bench_runs > 0:
                log("$ " + " ".join(shlex.quote(a) for a in r["bench_argv"]))
                try:
                    res = subprocess.run(
                        r["bench_argv"], capture_output=True, text=True, timeout=args.bench_timeout
                    )
                    bench = last_json(res.stdout)
                    summary["bench"] = {
                        "rc": res.returncode,
                        "stderr": res.stderr[-1000:],
                        **(
                            {
                                k: bench.get(k)
                                for k in (
                                    "median_ttft_s",
                                    "median_decode_tok_s",
                                    "prompt_tokens",
                                    "max_tokens",
                                    "runs",
                                )
                            }
                            if isinstance(bench, dict)
                            else {}
                        ),
                    }
                except subprocess.TimeoutExpired:
                    summary["bench"] = {"rc": None, "error": f"timeout {args.bench_timeout} s"}
                log(
                    f"bench: {json.dumps({k: v for k, v in summary['bench'].items() if k != 'runs'})}"
                )
    finally:
        stop_server()
        summary["seconds"] = round(time.monotonic() - t0, 1)

    text = engine_log.read_text(errors="replace")
    seen = {}
    m = re.findall(r"GPU KV cache size: ([\d,]+) tokens", text)
    if m:
        seen["tokens"] = int(m[-1].replace(",", ""))
    m = re.findall(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text)
    if m:
        seen["max_model_len"] = int(m[-1][0].replace(",", ""))
        seen["concurrency"] = m[-1][1]
    m = re.findall(r"Setting attention block size to (\d+) tokens", text)
    if m:
        seen["block_size"] = int(m[-1])
    summary["kv_seen"] = seen
    summary["kv_lines"] = [
        line[:400]
        for line in text.splitlines()
        if KV_LINE.search(line) and not PROGRESS.search(line)
    ][:80]
    plan = r["plan_kv"]
    fixture = r["fixture_recording"] or {}
    summary["kv_check"] = {
        "plan_kv": {
            "tokens": plan["tokens"],
            "concurrency": plan["max_concurrency_2dp"],
            "block_size": plan["block_size"],
        },
        "engine": seen,
        "fixture": {
            "tokens": fixture.get("kv_cache_tokens"),
            "concurrency": (fixture.get("max_concurrency") or "").rstrip("x") or None,
        },
        "engine_equals_plan": (
            seen.get("tokens") == plan["tokens"]
            and seen.get("concurrency") == plan["max_concurrency_2dp"]
        ),
        "engine_equals_fixture": (
            seen.get("tokens") == fixture.get("kv_cache_tokens")
            and f"{seen.get('concurrency')}x" == fixture.get("max_concurrency")
        ),
    }
    report = (summary.get("health") or {}).get("report") or {}
    summary["ok"] = bool(
        summary["health_wait"]["ok"]
        and summary.get("health", {}).get("rc") == 0
        and report.get("problems") == []
        and summary["kv_check"]["engine_equals_plan"]
    )
    write_json(summary_file, summary)
    log(
        f"kv: engine {seen} plan {summary['kv_check']['plan_kv']} fixture "
        f"{summary['kv_check']['fixture']}; ok={summary['ok']}"
    )
    for line in summary["kv_lines"][:40]:
        print("LOG| " + line)
    if not summary["health_wait"]["ok"]:
        print("engine log tail:")
        print("\n".join(text.splitlines()[-40:]))
    to_out(engine_log, summary_file)
    return 0 if summary["ok"] else 1


# --- collect / status ----------------------------------------------------------------------------


def cmd_collect(args) -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    dest = OUT / "sfprobe-results.tar.gz"
    with tarfile.open(dest, "w:gz") as tar:
        extra = [
            STATE / "install.log",
            *sorted(Path(LLAMA_WORK, "results").glob("*")),
            Path(LLAMA_BUILD_LOG),
            Path(LLAMA_WORK, "build-info.json"),
        ]
        for path in sorted(RESULTS.glob("*")) + extra:
            if path.is_file():
                tar.add(path, arcname=f"sfprobe-results/{path.name}")
    log(f"{dest}: {dest.stat().st_size:,} B")
    return 0


def cmd_status(args) -> int:
    manifest = STAGE / "payload.manifest"
    if manifest.exists():
        have, missing = staged(read_manifest(manifest))
        log(f"staged: {', '.join(have) or 'none'}; missing: {', '.join(missing) or 'none'}")
    else:
        log("nothing staged")
    pid_file = STATE / "install.pid"
    running = pid_file.exists() and alive(int(pid_file.read_text()))
    log(f"installed: {(STATE / 'install.done').exists()}; background install running: {running}")
    if (STATE / "install.log").exists():
        print((STATE / "install.log").read_text()[-1500:])
    pgid = STATE / "server.pgid"
    log(f"server pgid: {pgid.read_text().strip() if pgid.exists() else 'none'}")
    log(f"results: {', '.join(p.name for p in sorted(RESULTS.glob('*'))) or 'none'}")
    log(f"GPU memory used/total: {gpu_memory()}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("stage")
    s.add_argument("--no-auto-install", dest="auto_install", action="store_false")
    s = sub.add_parser("install")
    s.add_argument("--wait", type=float, default=480, help="seconds to wait for a background one")
    s.add_argument("--foreground", action="store_true", help="install now, in this process")
    sub.add_parser("patch-info")
    sub.add_parser("help")
    for name in ("serve", "render"):
        s = sub.add_parser(name)
        s.add_argument("max_model_len", type=int)
        s.add_argument("kv_bytes", type=int)
        s.add_argument("--model", default=str(TINY))
        s.add_argument("--port", type=int, default=8000)
        s.add_argument("--deadline", type=float, default=360, help="seconds to wait for /health")
        s.add_argument("--bench-runs", type=int, default=3)
        s.add_argument("--bench-prompt-tokens", type=int, default=512)
        s.add_argument("--bench-max-tokens", type=int, default=64)
        s.add_argument("--bench-timeout", type=float, default=120)
    sub.add_parser("collect")
    sub.add_parser("status")
    args = p.parse_args(argv)
    handler = {
        "stage": cmd_stage,
        "install": cmd_install,
        "patch-info": cmd_patch_info,
        "help": cmd_help,
        "serve": cmd_serve,
        "render": cmd_render,
        "collect": cmd_collect,
        "status": cmd_status,
    }[args.cmd]
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
