#!/usr/bin/python3 -I
"""vLLM engine stand-in for the testbed (no GPU there): one stdlib-only file, run by the real unit.

    vllm_standin.py serve MODEL_DIR --served-model-name N --dtype bfloat16 --max-model-len L
                    --host H --port P [--language-model-only] [--kv-cache-memory-bytes B] [...]

It takes exactly the argv the systemd unit gives the real `vllm` console script and:

1. rejects any flag that the installed vLLM version's `vllm serve --help=all` does not list (the
   captured texts are in the data dir, one per version), with one argparse-style line, exit 2;
2. reads the vLLM version installed in $VIRTUAL_ENV (the dist-info METADATA, no import) and the
   sha256 of MODEL_DIR/config.json, and looks up the real engine's log recorded on an H200 for
   that version, checkpoint, --max-model-len and --kv-cache-memory-bytes (index.json in the data
   dir); no recording: one line naming what was asked and what is recorded, exit 1;
   The argv must be the one the recording was started with (its "non-default args" line), but
   for the node's paths, address and key and the probe's own flags (index: probe_only_args):
   another served name or eager mode would replay another engine's start; one line, exit 1;
3. REPLAYS that recording's startup lines on stdout (the journal), up to "Application startup
   complete." It computes nothing about the KV cache: the numbers are the real engine's;
4. serves vLLM 0.24.0's HTTP contract on --host/--port, threaded: GET /health, /ping, /version,
   /v1/models; POST /v1/chat/completions and /v1/completions (non-streaming and SSE streaming,
   stream_options.include_usage, `data: [DONE]`), /tokenize, /detokenize. When an API key is set
   (--api-key, else VLLM_API_KEY) every path starting with /v1, /v2 or /inference needs
   `Authorization: Bearer KEY` (401 {"error": "Unauthorized"} otherwise), as vLLM 0.24.0's
   AuthenticationMiddleware does (vllm/entrypoints/serve/utils/server_utils.py); /health,
   /tokenize and the rest are open, OPTIONS is never checked.

Tokenizer: UTF-8 bytes are tokens 0-255 and the tiny checkpoint's special tokens keep their ids
(<|im_start|> 510, <|im_end|> 511 = EOS); chat prompts use the ChatML template. The completion
is a fixed sentence (temperature 0) or words drawn from a generator seeded by `seed` or by the
prompt (temperature > 0), then EOS ("stop"); max_tokens ends it early ("length"); ignore_eos
repeats it until max_tokens.

Test switch, not servefleet data: when /etc/servefleet-standin/fail-versions (or the file named by
$SERVEFLEET_STANDIN_FAIL_VERSIONS) lists the installed vLLM version, one per line, the stand-in
prints the first startup lines and then exits 1 with an engine-core traceback, on every start.

Data dir: <this file's dir>/standin-data/, or $SERVEFLEET_STANDIN_DATA.
"""

import ast
import glob
import hashlib
import http.server
import json
import os
import random
import re
import secrets
import signal
import socket
import socketserver
import sys
import threading
import time
import uuid

DATA_DIR_NAME = "standin-data"
DATA_ENV = "SERVEFLEET_STANDIN_DATA"
FAIL_FILE = "/etc/servefleet-standin/fail-versions"
FAIL_ENV = "SERVEFLEET_STANDIN_FAIL_VERSIONS"
# Test-only: replay the recording of another combination ("MAX_MODEL_LEN KV_BYTES"), as an
# engine whose KV arithmetic differs from plan-kv's would log other numbers.
REPLAY_FILE = "/etc/servefleet-standin/replay-instead"
REPLAY_ENV = "SERVEFLEET_STANDIN_REPLAY_INSTEAD"
ME = "vllm stand-in"

# vLLM 0.24.0 vllm/entrypoints/serve/utils/server_utils.py: AuthenticationMiddleware guards
# every path that starts with one of these (str.startswith, after removing root_path).
GUARDED_PREFIX = ("/v1", "/v2", "/inference")

# The tiny checkpoint's tokenizer (shared/gpu-probe/scripts/mk_tok.py): 7 specials at 505-511.
SPECIALS = {
    "<|endoftext|>": 505,
    "<|vision_start|>": 506,
    "<|vision_end|>": 507,
    "<|image_pad|>": 508,
    "<|video_pad|>": 509,
    "<|im_start|>": 510,
    "<|im_end|>": 511,
}
SPECIAL_RE = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")
ID_TO_SPECIAL = {v: k for k, v in SPECIALS.items()}
EOS_ID = 511
GREEDY_TEXT = "Hello from the servefleet vLLM stand-in. "
WORDS = ("fleet", "node", "model", "serve", "token", "cache", "hello", "world", "engine", "ok")
TOKEN_DELAY_S = 0.002  # between streamed tokens: TTFT and decode rate stay measurable

STARTUP_DONE = "Application startup complete."
SERVER_START = "Starting vLLM server on"
ENGINE_INIT = "Initializing a V1 LLM engine"


class Refusal(Exception):
    """Exit with one line on stderr and this status."""

    def __init__(self, line, status=1):
        super().__init__(line)
        self.line, self.status = line, status


def out(line=""):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------
# Data: the recordings, the help text
# ------------------------------------------------------------------------------------------


def data_dir():
    return os.environ.get(DATA_ENV) or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), DATA_DIR_NAME
    )


def load_index(data):
    path = os.path.join(data, "index.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        raise Refusal(f"{ME}: cannot read its recordings index {path}: {exc}") from None


def option_strings(help_text):
    """Flag -> nargs ('0', '1', '?', '*', '+') for every option line of `vllm serve --help=all`.

    argparse indents option lines by two spaces; the invocation runs up to the help column (two
    spaces) or the line's end; aliases are separated by ", " before a dash (`--x X, -x X`,
    `--flag, --no-flag`, `-h, --help`).
    """
    flags = {}
    for line in help_text.splitlines():
        if not re.match(r"^  -{1,2}[A-Za-z0-9]", line):
            continue
        invocation = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        for part in re.split(r",\s+(?=-)", invocation):
            flag, _, metavar = part.strip().partition(" ")
            metavar = metavar.strip()
            if not metavar:
                nargs = "0"
            elif metavar.endswith("...]"):
                nargs = "*" if metavar.startswith("[") else "+"
            elif re.fullmatch(r"\[[A-Z0-9_]+\]", metavar):
                nargs = "?"
            else:
                nargs = "1"
            flags[flag] = nargs
    return flags


def human_readable_int(value):
    """vLLM's parser for --max-model-len / --kv-cache-memory-bytes: 1k = 1000, 1K = 1024."""
    value = value.strip()
    if value.lower() == "auto":
        return -1
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)
    return int(value)


# ------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------


def parse_serve(argv, flags):
    """`serve` argv (after "serve") -> dict of the options the stand-in uses; unknown -> Refusal."""
    opts = {
        "model": None,
        "served_model_name": None,
        "max_model_len": None,
        "kv_cache_memory_bytes": None,
        "host": None,
        "port": "8000",
        "api_key": None,
        "help": False,
        "given": {},
    }
    unknown, positionals = [], []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            positionals.extend(argv[i:])
            break
        if not arg.startswith("-") or re.fullmatch(r"-\d+(\.\d+)?", arg):
            positionals.append(arg)
            continue
        if arg in ("-h", "--help") or arg.startswith("--help="):
            opts["help"] = True
            continue
        name, eq, inline = arg.partition("=")
        if name.startswith("--"):  # vLLM: `_` and `-` are equal in names, `--cfg.key` is JSON
            base = name.split(".", 1)[0].replace("_", "-")
        elif name.startswith("-O") and name != "-O":  # vLLM: -O3 (and -O=3 / -O 3 below)
            base, eq, inline = "--optimization-level", "=", arg[2:]
        elif name == "-O":
            base = "--optimization-level"
        else:
            base = name.split(".", 1)[0]
        dotted = "." in name
        if base not in flags:
            unknown.append(name)
            continue
        nargs = "1" if dotted else flags[base]
        values = []
        if eq:
            values = [inline]
        elif nargs == "1":
            if i >= len(argv):
                raise Refusal(f"vllm serve: error: argument {base}: expected one argument", 2)
            values, i = [argv[i]], i + 1
        elif nargs in "?*+":
            while i < len(argv) and not (argv[i].startswith("-") and len(argv[i]) > 1):
                values.append(argv[i])
                i += 1
                if nargs == "?":
                    break
            if nargs == "+" and not values:
                raise Refusal(
                    f"vllm serve: error: argument {base}: expected at least one argument", 2
                )
        key = base[2:].replace("-", "_")
        if dotted:
            continue
        if base.startswith("--"):  # as vLLM logs it: "non-default args: {...}"
            opts["given"][key] = True if nargs == "0" else values[0] if nargs == "1" else values
        if key in ("model", "host", "port", "max_model_len", "kv_cache_memory_bytes"):
            opts[key] = values[0] if values else None
        elif key in ("served_model_name", "api_key"):
            opts[key] = values
    if unknown:
        raise Refusal("vllm serve: error: unrecognized arguments: " + " ".join(unknown), 2)
    if opts["help"]:
        return opts
    if positionals and opts["model"] is None:
        opts["model"] = positionals.pop(0)
    elif positionals and opts["model"] is not None and positionals[0] == opts["model"]:
        positionals.pop(0)
    if positionals:
        raise Refusal("vllm serve: error: unrecognized arguments: " + " ".join(positionals), 2)
    if not opts["model"]:
        raise Refusal(f"{ME}: no model given (vllm serve MODEL_DIR ...)", 2)
    for key in ("max_model_len", "kv_cache_memory_bytes"):
        if opts[key] is not None:
            try:
                opts[key] = human_readable_int(opts[key])
            except ValueError:
                raise Refusal(
                    f"vllm serve: error: argument --{key.replace('_', '-')}: "
                    f"invalid value: {opts[key]!r}",
                    2,
                ) from None
    try:
        opts["port"] = int(opts["port"])
    except ValueError:
        raise Refusal(
            f"vllm serve: error: argument --port: invalid value: {opts['port']!r}", 2
        ) from None
    opts["served_model_name"] = opts["served_model_name"] or [opts["model"]]
    return opts


# ------------------------------------------------------------------------------------------
# What it was started with: vLLM version, checkpoint
# ------------------------------------------------------------------------------------------


def installed_version(venv):
    """Version: header of $VIRTUAL_ENV/lib/python3.*/site-packages/vllm-*.dist-info/METADATA."""
    if not venv:
        raise Refusal(f"{ME}: VIRTUAL_ENV is not set: cannot tell which vLLM version to replay")
    found = sorted(
        glob.glob(
            os.path.join(venv, "lib", "python3.*", "site-packages", "vllm-*.dist-info", "METADATA")
        )
    )
    if len(found) != 1:
        raise Refusal(
            f"{ME}: expected one vllm-*.dist-info/METADATA under {venv}/lib/python3.*/"
            f"site-packages, found {len(found)}"
        )
    with open(found[0], encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                break  # end of the headers
            if line.lower().startswith("version:"):
                return line.split(":", 1)[1].strip()
    raise Refusal(f"{ME}: no Version header in {found[0]}")


def config_sha256(model_dir):
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as exc:
        raise Refusal(f"{ME}: cannot read the checkpoint's config.json ({path}): {exc}") from None


def serve_help(index, version):
    """The `vllm serve --help=all` captured for this version: its flags are the ones accepted."""
    for entry in index["serve_help"]:
        if entry["vllm_version"] == version:
            return entry
    captured = ", ".join(e["vllm_version"] for e in index["serve_help"])
    raise Refusal(
        f"{ME}: no `vllm serve --help=all` of vLLM {version} is captured (captured: "
        f"{captured}): its flags are unknown, so no unit of it is checked"
    )


def find_recording(index, version, sha, max_model_len, kv_bytes):
    recordings = index.get("recordings", [])
    for rec in recordings:
        if (
            rec["vllm_version"],
            rec["config_sha256"],
            rec["max_model_len"],
            rec["kv_cache_memory_bytes"],
        ) == (version, sha, max_model_len, kv_bytes):
            return rec
    recorded = (
        "; ".join(
            f"vLLM {r['vllm_version']} config {r['config_sha256'][:12]} max_model_len "
            f"{r['max_model_len']} kv_cache_memory_bytes {r['kv_cache_memory_bytes']}"
            for r in recordings
        )
        or "none"
    )
    raise Refusal(
        f"{ME}: no H200 recording for vLLM {version}, config.json sha256 {sha}, max_model_len "
        f"{'unset' if max_model_len is None else max_model_len}, kv_cache_memory_bytes "
        f"{'unset' if kv_bytes is None else kv_bytes}; recorded: {recorded}"
    )


# What a recording's "non-default args" may differ in from the argv: the node's own paths and
# address, and the secret. Anything else (served name, eager mode, dtype, ...) would make the
# replayed journal describe another engine than the unit starts.
NODE_ARGS = {"model_tag", "model", "host", "port", "api_key"}


def recorded_args(path):
    """The recording's `non-default args: {...}` (vLLM's own log line), or None."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "non-default args: " in line:
                try:
                    return ast.literal_eval(line.split("non-default args: ", 1)[1].strip())
                except (ValueError, SyntaxError):
                    return None
    return None


def _norm(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    try:
        return human_readable_int(str(value))
    except ValueError:
        return str(value)


def argv_mismatch(given, recorded, probe_only):
    """The options in which the argv and the recording's differ: "key: argv X, recorded Y"."""
    skip = NODE_ARGS | set(probe_only)
    out = []
    for key in sorted((set(given) | set(recorded)) - skip):
        a, r = given.get(key), recorded.get(key)
        if a is None or r is None or _norm(a) != _norm(r):
            out.append(
                f"{key}: argv {'unset' if a is None else a!r}, recorded "
                f"{'unset' if r is None else r!r}"
            )
    return out


def check_recording(opts, recording, path):
    """Refuse to replay a recording made with other arguments than this argv."""
    recorded = recorded_args(path)
    if recorded is None:
        raise Refusal(
            f"{ME}: {recording['file']} has no `non-default args` line: cannot tell "
            f"what the recorded engine was started with"
        )
    differ = argv_mismatch(opts["given"], recorded, recording.get("probe_only_args", ()))
    if differ:
        raise Refusal(
            f"{ME}: {recording['file']} was recorded with other arguments than this "
            f"argv ({'; '.join(differ)}): record this argv on a GPU node "
            f"(tests/device/), a replay would show another engine's start"
        )


def replay_instead():
    """(max_model_len, kv_bytes) the tests want replayed instead of the asked one, or None."""
    path = os.environ.get(REPLAY_ENV) or REPLAY_FILE
    try:
        with open(path, encoding="utf-8") as f:
            fields = f.read().split()
    except OSError:
        return None
    if len(fields) != 2 or not all(x.isdigit() for x in fields):
        raise Refusal(f"{ME}: {path} must hold 'MAX_MODEL_LEN KV_BYTES', found {fields!r}")
    return int(fields[0]), int(fields[1])


def fail_versions():
    path = os.environ.get(FAIL_ENV) or FAIL_FILE
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.split("#", 1)[0].strip() for line in f]
    except OSError:
        return path, set()
    return path, {line for line in lines if line}


# ------------------------------------------------------------------------------------------
# Tokenizer and "generation"
# ------------------------------------------------------------------------------------------


def encode(text):
    ids = []
    for piece in SPECIAL_RE.split(text):
        if piece in SPECIALS:
            ids.append(SPECIALS[piece])
        elif piece:
            ids.extend(piece.encode("utf-8"))
    return ids


def decode(ids):
    raw, parts = bytearray(), []
    for t in ids:
        if t < 256:
            raw.append(t)
        else:
            parts.append(raw.decode("utf-8", errors="replace") + ID_TO_SPECIAL.get(t, ""))
            raw = bytearray()
    return "".join(parts) + raw.decode("utf-8", errors="replace")


def message_text(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def render_chat(messages, add_generation_prompt=True):
    """The probe tokenizer's ChatML template (shared/gpu-probe/scripts/chat_template.jinja)."""
    text = "".join(
        f"<|im_start|>{m.get('role', '')}\n{message_text(m.get('content'))}<|im_end|>\n"
        for m in messages
        if isinstance(m, dict)
    )
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def completion_tokens(prompt_ids, temperature, seed, max_tokens, ignore_eos):
    """(token ids, finish_reason): a fixed sentence, or seeded words when temperature > 0."""
    if temperature == 0:
        text = GREEDY_TEXT
    else:
        rng = random.Random(
            seed
            if seed is not None
            else hashlib.sha256(bytes(str(prompt_ids), "ascii")).hexdigest()
        )
        text = " ".join(rng.choice(WORDS) for _ in range(8)) + ". "
    sentence = encode(text)
    if not ignore_eos and max_tokens > len(sentence):
        return sentence, "stop"
    reps = -(-max_tokens // len(sentence))
    return (sentence * reps)[:max_tokens], "length"


class BadRequest(Exception):
    def __init__(self, message, param=None, status=400, err_type="BadRequestError"):
        super().__init__(message)
        self.message, self.param, self.status, self.err_type = message, param, status, err_type


def sampling(body, prompt_len, max_model_len):
    """max_tokens, temperature, seed, ignore_eos as vLLM 0.24.0 checks them."""
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    temperature = body.get("temperature")
    temperature = 1.0 if temperature is None else temperature
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise BadRequest(f"temperature must be non-negative, got {temperature}.", "temperature")
    if prompt_len > max_model_len or (
        max_tokens is not None and prompt_len + max_tokens > max_model_len
    ):
        requested = max_tokens if max_tokens is not None else 0
        raise BadRequest(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {requested} output tokens and your prompt contains {prompt_len} input "
            f"tokens, for a total of {prompt_len + requested} tokens. Please reduce the length "
            f"of the input prompt or the number of requested output tokens.",
            "input_tokens",
        )
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len
        if max_tokens < 1:
            raise BadRequest(
                f"Input length ({prompt_len}) exceeds model's maximum context "
                f"length ({max_model_len}).",
                "input_tokens",
            )
    n = body.get("n") or 1
    if not isinstance(n, int) or n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.", "n")
    return {
        "max_tokens": max_tokens,
        "temperature": float(temperature),
        "seed": body.get("seed"),
        "ignore_eos": bool(body.get("ignore_eos")),
        "n": n,
    }


# ------------------------------------------------------------------------------------------
# HTTP
# ------------------------------------------------------------------------------------------


class Engine:
    """What the handlers need: names, max_model_len, keys, version, a lock for stdout."""

    def __init__(self, opts, version):
        self.names = opts["served_model_name"]
        self.model_path = opts["model"]
        self.max_model_len = opts["max_model_len"] or 0
        # vLLM: `args.api_key or [envs.VLLM_API_KEY]`, empty keys dropped.
        keys = [k for k in (opts["api_key"] or [os.environ.get("VLLM_API_KEY")]) if k]
        self.key_hashes = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]
        self.version = version
        self.lock = threading.Lock()
        self.created = int(time.time())

    def log(self, line):
        with self.lock:
            out(line)

    def authorized(self, header):
        if not header:
            return False
        scheme, _, param = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(param.encode("utf-8")).digest()
        match = False
        for known in self.key_hashes:
            match |= secrets.compare_digest(digest, known)
        return match


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    engine: "Engine" = None  # set on the subclass made in serve()

    def version_string(self):
        return "uvicorn"

    # -- plumbing ------------------------------------------------------------------------
    def log_message(self, fmt, *args):  # errors from the base class
        self.engine.log(
            f"(APIServer pid={os.getpid()}) INFO:     {self.address_string()} - {fmt % args}"
        )

    def log_request(self, code="-", size="-"):
        code = int(code) if str(code).isdigit() else code
        phrase = self.responses.get(code, ("",))[0] if isinstance(code, int) else ""
        self.engine.log(
            f"(APIServer pid={os.getpid()}) INFO:     {self.client_address[0]}:"
            f'{self.client_address[1]} - "{self.command} {self.path} '
            f'{self.request_version}" {code} {phrase}'.rstrip()
        )

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_empty(self, status=200):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def send_error_response(self, err):
        self.send_json(
            err.status,
            {
                "error": {
                    "message": err.message,
                    "type": err.err_type,
                    "param": err.param,
                    "code": err.status,
                }
            },
        )

    def read_json(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        media = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise BadRequest("Unsupported Media Type: Only 'application/json' is allowed")
        try:
            body = json.loads(raw or b"null")
        except ValueError as exc:
            raise BadRequest(f"JSON decode error: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("Input should be a valid dictionary or object")
        return body

    def check_model(self, body):
        model = body.get("model")
        if model and model not in self.engine.names:
            raise BadRequest(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
        return model or self.engine.names[0]

    # -- dispatch ------------------------------------------------------------------------
    ROUTES = {
        "/health": ("GET",),
        "/ping": ("GET", "POST"),
        "/version": ("GET",),
        "/v1/models": ("GET",),
        "/v1/chat/completions": ("POST",),
        "/v1/completions": ("POST",),
        "/tokenize": ("POST",),
        "/detokenize": ("POST",),
    }

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_HEAD(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def do_DELETE(self):
        self.dispatch()

    def do_OPTIONS(self):
        self.dispatch()

    def dispatch(self):
        path = self.path.split("?", 1)[0]
        if (
            self.engine.key_hashes
            and self.command != "OPTIONS"
            and path.startswith(GUARDED_PREFIX)
            and not self.engine.authorized(self.headers.get("Authorization"))
        ):
            self.drain()
            return self.send_json(401, {"error": "Unauthorized"})
        methods = self.ROUTES.get(path)
        if methods is None:
            self.drain()
            return self.send_json(404, {"detail": "Not Found"})
        if self.command not in methods and not (self.command == "HEAD" and "GET" in methods):
            self.drain()
            return self.send_json(405, {"detail": "Method Not Allowed"})
        try:
            getattr(self, "route_" + path.strip("/").replace("/", "_"))()
        except BadRequest as err:
            self.send_error_response(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug here: answer like vLLM's generic handler, keep serving
            self.close_connection = True
            self.send_error_response(
                BadRequest(f"{type(exc).__name__}: {exc}", None, 500, "InternalServerError")
            )

    def drain(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)

    # -- routes --------------------------------------------------------------------------
    def route_health(self):
        self.send_empty(200)

    def route_ping(self):
        self.drain()
        self.send_empty(200)

    def route_version(self):
        self.send_json(200, {"version": self.engine.version})

    def route_v1_models(self):
        e = self.engine
        self.send_json(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": name,
                        "object": "model",
                        "created": e.created,
                        "owned_by": "vllm",
                        "root": e.model_path,
                        "parent": None,
                        "max_model_len": e.max_model_len,
                        "permission": [
                            {
                                "id": f"modelperm-{uuid.uuid4().hex}",
                                "object": "model_permission",
                                "created": e.created,
                                "allow_create_engine": False,
                                "allow_sampling": True,
                                "allow_logprobs": True,
                                "allow_search_indices": False,
                                "allow_view": True,
                                "allow_fine_tuning": False,
                                "organization": "*",
                                "group": None,
                                "is_blocking": False,
                            }
                        ],
                    }
                    for name in e.names
                ],
            },
        )

    def route_tokenize(self):
        body = self.read_json()
        self.check_model(body)
        if "messages" in body:
            if not isinstance(body["messages"], list):
                raise BadRequest("messages: Input should be a valid list", "messages")
            ids = encode(render_chat(body["messages"], body.get("add_generation_prompt", True)))
        elif isinstance(body.get("prompt"), str):
            ids = encode(body["prompt"])
        else:
            raise BadRequest("prompt: Field required", "prompt")
        answer = {
            "count": len(ids),
            "max_model_len": self.engine.max_model_len,
            "tokens": ids,
            "token_strs": [decode([t]) for t in ids] if body.get("return_token_strs") else None,
        }
        self.send_json(200, answer)

    def route_detokenize(self):
        body = self.read_json()
        self.check_model(body)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and t >= 0 for t in tokens):
            raise BadRequest(
                "tokens: Input should be a valid list of non-negative integers", "tokens"
            )
        self.send_json(200, {"prompt": decode(tokens)})

    def route_v1_chat_completions(self):
        body = self.read_json()
        model = self.check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("messages: Field required", "messages")
        prompt_ids = encode(render_chat(messages, body.get("add_generation_prompt", True)))
        self.generate(body, model, prompt_ids, chat=True)

    def route_v1_completions(self):
        body = self.read_json()
        model = self.check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = encode(prompt)
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            prompt_ids = list(prompt)
        else:
            raise BadRequest(
                "prompt: the stand-in takes one string or one list of token ids", "prompt"
            )
        self.generate(body, model, prompt_ids, chat=False)

    # -- generation ----------------------------------------------------------------------
    def generate(self, body, model, prompt_ids, chat):
        s = sampling(body, len(prompt_ids), self.engine.max_model_len)
        outputs = [
            completion_tokens(
                prompt_ids,
                s["temperature"],
                None if s["seed"] is None else s["seed"] + k,
                s["max_tokens"],
                s["ignore_eos"],
            )
            for k in range(s["n"])
        ]
        usage = {
            "prompt_tokens": len(prompt_ids),
            "total_tokens": len(prompt_ids) + sum(len(ids) for ids, _ in outputs),
            "completion_tokens": sum(len(ids) for ids, _ in outputs),
            "prompt_tokens_details": None,
        }
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        if body.get("stream"):
            return self.stream(body, model, rid, created, outputs, usage, chat)
        if chat:
            choices = [
                {
                    "index": k,
                    "message": {
                        "role": "assistant",
                        "content": decode(ids),
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": None,
                    "token_ids": None,
                }
                for k, (ids, reason) in enumerate(outputs)
            ]
            obj = "chat.completion"
        else:
            choices = [
                {
                    "index": k,
                    "text": decode(ids),
                    "logprobs": None,
                    "finish_reason": reason,
                    "stop_reason": None,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                }
                for k, (ids, reason) in enumerate(outputs)
            ]
            obj = "text_completion"
        self.send_json(
            200,
            {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "kv_transfer_params": None,
            },
        )

    def stream(self, body, model, rid, created, outputs, usage, chat):
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        obj = "chat.completion.chunk" if chat else "text_completion"
        prompt_len = usage["prompt_tokens"]

        def event(choices, chunk_usage=None, final=False):
            chunk = {
                "id": rid,
                "object": obj,
                "created": created,
                "model": model,
                "choices": choices,
            }
            if chunk_usage is not None or final:
                chunk["usage"] = chunk_usage
            self.write_chunk(f"data: {json.dumps(chunk)}\n\n".encode())

        def running_usage(done):
            return {
                "prompt_tokens": prompt_len,
                "total_tokens": prompt_len + done,
                "completion_tokens": done,
            }

        if chat:
            for k in range(len(outputs)):
                event(
                    [
                        {
                            "index": k,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                    running_usage(0) if continuous else None,
                )
        for k, (ids, reason) in enumerate(outputs):
            for pos, tid in enumerate(ids):
                time.sleep(TOKEN_DELAY_S)
                last = pos == len(ids) - 1
                piece = decode([tid])
                choice = (
                    {"index": k, "delta": {"content": piece}}
                    if chat
                    else {"index": k, "text": piece}
                )
                choice.update({"logprobs": None, "finish_reason": reason if last else None})
                if last:
                    choice["stop_reason"] = None
                event([choice], running_usage(pos + 1) if continuous else None)
            if not ids:
                choice = (
                    {"index": k, "delta": {"content": ""}} if chat else {"index": k, "text": ""}
                )
                choice.update({"logprobs": None, "finish_reason": reason, "stop_reason": None})
                event([choice])
        if include_usage:
            event([], {k: v for k, v in usage.items() if k != "prompt_tokens_details"}, final=True)
        self.write_chunk(b"data: [DONE]\n\n")
        self.write_chunk(b"")

    def write_chunk(self, data):
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class Server6(Server):
    address_family = socket.AF_INET6


# ------------------------------------------------------------------------------------------
# Start
# ------------------------------------------------------------------------------------------


def startup_lines(path):
    """The recording's lines up to and including the first "Application startup complete."."""
    lines = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            lines.append(line.rstrip("\n"))
            if STARTUP_DONE in line:
                break
    return lines


def simulated_crash(lines, version, fail_file):
    """A few startup lines, then an engine-core failure like a real one; exit 1."""
    head = []
    for line in lines:
        head.append(line)
        if ENGINE_INIT in line:
            break
    out(
        f"{ME}: replaying the first startup lines of the real vLLM {version} engine recorded on "
        f"an H200, then a simulated engine failure ({version} is listed in {fail_file})"
    )
    for line in head[:40]:
        out(line)
    stamp = time.strftime("%m-%d %H:%M:%S")
    pid = os.getpid()
    prefix = f"(EngineCore pid={pid}) ERROR {stamp} [core.py:1231]"
    why = (
        f"RuntimeError: simulated engine start failure ({ME}: vLLM {version} is listed in "
        f"{fail_file})"
    )
    for line in (
        "EngineCore failed to start.",
        "Traceback (most recent call last):",
        '  File "vllm/v1/engine/core.py", line 1200, in run_engine_core',
        "    engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
        why,
    ):
        out(f"{prefix} {line}")
    out(
        f"(APIServer pid={pid}) RuntimeError: Engine core initialization failed. See root cause "
        f"above. Failed core proc(s): {{}}"
    )
    return 1


def serve(opts, version, lines, recording):
    before, after = [], []
    target = before
    for line in lines:
        if SERVER_START in line:
            target = after
        target.append(line)
    out(
        f"{ME}: replaying the real vLLM {version} engine's startup recorded on an H200 "
        f"({recording['file']}); this is not vLLM, nothing is computed"
    )
    for line in before:
        out(line)

    engine = Engine(opts, version)
    handler = type("BoundHandler", (Handler,), {"engine": engine})
    host = opts["host"] or ""
    try:
        server = (Server6 if ":" in host else Server)((host, opts["port"]), handler)
    except OSError as exc:
        out(
            f"(APIServer pid={os.getpid()}) ERROR: [Errno {exc.errno}] error while attempting to "
            f"bind on address ({host!r}, {opts['port']}): {exc.strerror}"
        )
        return 1
    for line in after:
        out(line)
    out(f"{ME}: listening on http://{host or '0.0.0.0'}:{server.server_address[1]}")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
    )
    thread.start()
    while not stop.wait(1.0):
        pass
    out(f"(APIServer pid={os.getpid()}) INFO:     Shutting down")
    server.shutdown()
    server.server_close()
    out(f"(APIServer pid={os.getpid()}) INFO:     Application shutdown complete.")
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv or argv[0] in ("-h", "--help"):
            out("usage: vllm serve MODEL_DIR [options]   (the servefleet testbed's vLLM stand-in)")
            return 0 if argv else 2
        if argv[0] in ("-v", "--version"):
            out(installed_version(os.environ.get("VIRTUAL_ENV")))
            return 0
        if argv[0] != "serve":
            raise Refusal(f"vllm: error: {ME} implements only `vllm serve`, not {argv[0]!r}", 2)
        data = data_dir()
        index = load_index(data)
        version = installed_version(os.environ.get("VIRTUAL_ENV"))
        help_file = os.path.join(data, serve_help(index, version)["file"])
        try:
            with open(help_file, encoding="utf-8") as f:
                help_text = f.read()
        except OSError as exc:
            raise Refusal(f"{ME}: cannot read {help_file}: {exc}") from None
        opts = parse_serve(argv[1:], option_strings(help_text))
        if opts["help"]:
            sys.stdout.write(help_text)
            sys.stdout.flush()
            return 0
        sha = config_sha256(opts["model"])
        asked = (opts["max_model_len"], opts["kv_cache_memory_bytes"])
        recording = find_recording(index, version, sha, *(replay_instead() or asked))
        lines = startup_lines(os.path.join(data, recording["file"]))
        fail_file, failing = fail_versions()
        if version in failing:
            return simulated_crash(lines, version, fail_file)
        if not replay_instead():  # a test's deliberate other combination differs by design
            check_recording(opts, recording, os.path.join(data, recording["file"]))
        return serve(opts, version, lines, recording)
    except Refusal as refusal:
        sys.stdout.flush()
        sys.stderr.write(refusal.line + "\n")
        sys.stderr.flush()
        return refusal.status


if __name__ == "__main__":
    sys.exit(main())
