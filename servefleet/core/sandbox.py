"""The serving units' sandbox, stated once.

`properties()` is the one list of systemd settings that confines a serving engine. Both units
write it (files/hardening.j2 renders it) and the probe that runs before a (re)start applies the
very same list to a transient unit (`probe_script`, servefleet.operations.sandbox), so a setting
that would stop the engine is found before the running service is touched.

GPU access behind DevicePolicy=closed: systemd matches `char-NAME` against the group names in
/proc/devices (fnmatch) and allows every minor of a matching major. NVIDIA's drivers name the
GPUs' group differently (tables in tests/fixtures/devices/):
- the open module (the only one for Blackwell, the installer's default since R560) and every
  driver since 550.40: `nvidia` (/dev/nvidia0..N, 195:N) and `nvidiactl` (195:255);
- the proprietary module before 550.40: `nvidia-frontend` (the same major 195);
- both: `nvidia-uvm` (/dev/nvidia-uvm, -tools) and `nvidia-caps` (/dev/nvidia-caps/*).
A name that /proc/devices does not list matches nothing and is harmless, so the list names all.
Nothing else: not `nvidia-nvlink`, `nvidia-nvswitch` nor `nvidia-caps-imex-channels` (fabric
management, not CUDA). /dev/nvidia-modeset (195:254) shares the GPUs' major: allowed too.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from servefleet.core import systemd as sd

NVIDIA_DEVICE_GROUPS = ("nvidia", "nvidiactl", "nvidia-frontend", "nvidia-uvm", "nvidia-caps")

# After a reboot the UVM nodes (and /dev/nvidia0) appear when the first CUDA user runs the
# setuid nvidia-modprobe. Inside the unit it cannot (NoNewPrivileges, no capabilities), so root
# makes them before the sandboxed start: `+` runs it without the sandbox, `-` tolerates a node
# without nvidia-modprobe (the driver's udev rules or nvidia-persistenced made them already).
NVIDIA_MODPROBE = "/usr/bin/nvidia-modprobe"
GPU_NODES_ARGV = (NVIDIA_MODPROBE, "-u", "-c=0")

DEFAULT_SYSCALL_FILTER = ("@system-service",)
# One SystemCallFilter= word: a system-call name or @group, `~` in front to remove it.
SYSCALL_WORD = re.compile(r"~?@?[a-z][a-z0-9_-]{0,63}")


def properties(
    read_write_paths: Sequence[str],
    gpu: bool,
    memory_deny_write_execute: bool,
    syscall_filter=DEFAULT_SYSCALL_FILTER,
    address_families=("AF_INET", "AF_INET6", "AF_UNIX"),
    hidden_paths: tuple[str, ...] = (),
) -> list[tuple[str, str]]:
    """(setting, value) pairs, in unit-file order; values are plain (no quoting needed).

    read_write_paths: the only places the engine may write (everything else is read-only).
    hidden_paths: what the engine may not even read (InaccessiblePaths=, `-`: a path that does
    not exist yet is no error): the node root's etc/ and state/. The secrets there (the hub
    token and the depot key, which the model fetcher reads) and root's records are handed to
    no engine; its API key reaches it through systemd (LoadCredential=, EnvironmentFile=, read
    by PID 1 before the sandbox applies).
    gpu: the NVIDIA character devices are allowed (nothing else is, DevicePolicy=closed).
    memory_deny_write_execute: no memory both writable and executable (W^X).
    syscall_filter: SystemCallFilter= words (an allow list, `~` entries removed from it).
    """
    props = [
        ("ReadWritePaths", " ".join(sd.setting(p) for p in read_write_paths)),
        *(
            [("InaccessiblePaths", " ".join("-" + sd.setting(p) for p in hidden_paths))]
            if hidden_paths
            else []
        ),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("NoNewPrivileges", "yes"),
        ("CapabilityBoundingSet", ""),
        ("AmbientCapabilities", ""),
        ("ProtectKernelTunables", "yes"),
        ("ProtectKernelModules", "yes"),
        ("ProtectKernelLogs", "yes"),
        ("ProtectControlGroups", "yes"),
        ("ProtectClock", "yes"),
        ("ProtectHostname", "yes"),
        ("ProtectProc", "invisible"),
        ("RestrictNamespaces", "yes"),
        ("RestrictSUIDSGID", "yes"),
        ("RestrictRealtime", "yes"),
        ("RestrictAddressFamilies", " ".join(address_families)),
        ("SystemCallArchitectures", "native"),
        *_syscall_filter(syscall_filter),
        ("LockPersonality", "yes"),
        ("RemoveIPC", "yes"),
        ("KeyringMode", "private"),
        ("UMask", "0077"),
        ("DevicePolicy", "closed"),
    ]
    if gpu:
        props += [("DeviceAllow", f"char-{name} rw") for name in NVIDIA_DEVICE_GROUPS]
    if memory_deny_write_execute:
        props.append(("MemoryDenyWriteExecute", "yes"))
    return props


def _syscall_filter(words) -> list[tuple[str, str]]:
    """SystemCallFilter= lines: the allow list, then one `~` line removing from it (a `~` is
    only understood as the first character of an assignment)."""
    allow = [_syscall_word(w) for w in words if not w.startswith("~")]
    remove = [_syscall_word(w)[1:] for w in words if w.startswith("~")]
    if not allow:
        raise sd.UnitValueError("SystemCallFilter= needs an allow list (e.g. @system-service)")
    lines = [("SystemCallFilter", " ".join(allow))]
    return lines + ([("SystemCallFilter", "~" + " ".join(remove))] if remove else [])


def _syscall_word(word: str) -> str:
    # The data contract checks the knob; this is the second line before a unit file.
    if not SYSCALL_WORD.fullmatch(word):
        raise sd.UnitValueError(f"{word!r} is not a system-call group or name")
    return word


def gpu_setup_line() -> str:
    """ExecStartPre= value: the GPU's device nodes made by root before the sandboxed start."""
    return "+-" + " ".join(GPU_NODES_ARGV)


# --- the probe: the same sandbox, a short command, before a (re)start ---------------------------

PROBE_TIMEOUT_S = 120


def probe_script(
    unit: str,
    user: str,
    props: list[tuple[str, str]],
    environment: list[str],
    argv: list[str],
    gpu: bool,
) -> str:
    """A root shell script: run `argv` as `user` in a transient unit with `props`, print one line
    naming what failed and exit 1 when it does not succeed.

    environment: the unit's Environment= words (quoted as in the unit file).
    """
    stem = unit.removesuffix(".service")
    args = [
        "systemd-run",
        "--wait",
        "--pipe",
        "--collect",
        "--service-type=exec",
        f"--unit={stem}-probe",
        f"--property=User={user}",
        f"--property=Group={user}",
        f"--property=RuntimeMaxSec={PROBE_TIMEOUT_S}",
    ]
    args += [f"--property=Environment={word}" for word in environment]
    args += [f"--property={key}={value}" for key, value in props]
    args += ["--", *argv]
    run = " ".join(shlex.quote(a) for a in args)
    setup = ""
    if gpu:
        modprobe = " ".join(shlex.quote(a) for a in GPU_NODES_ARGV)
        setup = f"if [ -x {NVIDIA_MODPROBE} ]; then {modprobe} || true; fi; "
    what = shlex.quote(
        f"servefleet: {unit}: the sandbox probe ({' '.join(argv)}) failed under "
        "the unit's sandbox, so the service was not restarted:"
    )
    return (
        f"{setup}out=$({run} 2>&1); rc=$?; "
        f'if [ $rc -ne 0 ]; then echo {what} "$(printf \'%s\\n\' "$out" | '
        f'awk {EXPLAIN_AWK})" >&2; exit 1; fi; '
        f"printf '%s\\n' \"$out\" | grep -v {SYSTEMD_RUN_LINES} | tail -n 3"
    )


# systemd-run's own lines around the probe's output (without --quiet it reports how the main
# process ended: "Main processes terminated with: code=exited/status=216" on systemd 252,
# "code=exited, status=216/GROUP" on 257, which names every status; IO accounting adds "IO
# bytes" lines). Captures of both: tests/fixtures/systemd/systemd-run-*.txt.
SYSTEMD_RUN_LINES = shlex.quote(
    "^Running as unit: \\|^Finished with result: \\|^Main processes terminated with: \\|"
    "^Service runtime: \\|^CPU time consumed: \\|^Memory peak: \\|^IP traffic \\|^IO bytes "
)

# The one line: the probe's last line of its own (e.g. "Permission denied") and systemd's verdict,
# its status named where systemd left it a number (as later systemd names it); SIGSYS means a
# system call outside SystemCallFilter= (the filter kills the process).
EXPLAIN_AWK = shlex.quote(
    r'/^Main processes terminated with: / { sub(/^Main processes terminated with: /, ""); '
    r"verdict = $0; next } "
    r"/^(Running as unit|Finished with result|Service runtime|CPU time consumed|Memory peak|"
    r"IP traffic|IO bytes)/ { next } NF { last = $0 } "
    r'END { sub(/status=203$/, "status=203/EXEC", verdict); '
    r'sub(/status=216$/, "status=216/GROUP", verdict); '
    r'sub(/status=217$/, "status=217/USER", verdict); '
    r'sub(/status=226$/, "status=226/NAMESPACE", verdict); '
    r'if (verdict ~ /status=(31\/)?SYS$/) verdict = verdict " (a system call outside '
    r'SystemCallFilter=)"; if (verdict ~ /status=226\/NAMESPACE$/) verdict = verdict " (a '
    r'ReadWritePaths= or other mount of the sandbox failed)"; '
    r'print last ((last != "" && verdict != "") ? "; " : "") verdict }'
)


# --- a recorded unit's sandbox, read back: a rollback probes the unit it restarts into ---------

SANDBOX_KEYS = frozenset(
    key
    for key, _ in properties(["/"], gpu=True, memory_deny_write_execute=True, hidden_paths=("/x",))
)


class UnitReadError(ValueError):
    """A recorded unit file that does not say what the probe needs."""


def unit_sandbox(unit_text: str) -> tuple[str, list[tuple[str, str]], list[str], bool]:
    """(User=, the sandbox settings in file order, the Environment= words, gpu) of a unit
    file's [Service] section, as properties() and the templates wrote them; gpu when the unit
    allows devices (DeviceAllow= is written for the GPU only)."""
    section, user, props, env = None, None, [], []
    for line in unit_text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if section != "Service" or not sep:
            continue
        if key == "User":
            user = value
        elif key == "Environment":
            env.append(value)
        elif key in SANDBOX_KEYS:
            props.append((key, value))
    if not user or not any(k == "DevicePolicy" for k, _ in props):
        raise UnitReadError("the recorded unit has no User= or no sandbox (DevicePolicy=)")
    return user, props, env, any(k == "DeviceAllow" for k, _ in props)


def version_argv(unit_text: str) -> list[str]:
    """The unit's ExecStart= program asked for its version: the probe of a release recorded
    before releases carried their own (servefleet.core.releases.Release.probe_argv)."""
    for line in unit_text.splitlines():
        if line.startswith("ExecStart="):
            words = line.removeprefix("ExecStart=").split()  # the program: a plain path
            if words and words[0].startswith("/"):
                return [words[0], "--version"]
    raise UnitReadError("the recorded unit has no ExecStart= with an absolute program")
