#!/usr/bin/env python3
"""Run a rendered servefleet unit under its sandbox on a machine without systemd (the lent H200),
with what the kernel applies without it. Stdlib + libseccomp (ctypes); run as root.

    sandbox_exec.py UNIT_FILE [--mdwe on|off|unit] [--setenv K=V ...] [--check] [--argv ...]

Runs the unit's ExecStartPre= lines (`+` ones as root, unsandboxed, as systemd does; the others
sandboxed), then ExecStart= (or --argv) sandboxed, and waits for it; SIGTERM/SIGINT are passed
on. `--check` prints what would be applied and tries each piece in a throwaway child.

Applied from the unit file itself (one source: what servefleet rendered):
- User=/Group=: initgroups-like (no supplementary groups), setgid, setuid; UMask=;
  WorkingDirectory=; only the unit's Environment= plus systemd's USER, LOGNAME, SHELL and its
  default PATH when the unit sets none;
- a mount namespace: every mount read-only (ProtectSystem=strict; ProtectKernelTunables and
  ProtectControlGroups: /sys and /proc/sys too) but the unit's ReadWritePaths=; /tmp and
  /var/tmp private (PrivateTmp=); InaccessiblePaths= under mode-000 nodes; /home, /root,
  /run/user empty (ProtectHome=); a /dev that
  holds only what DevicePolicy=closed + DeviceAllow= allow on this machine's /proc/devices (the
  model in servefleet_dev/testing/sandbox_model.py), plus a private /dev/shm and /dev/pts;
- NoNewPrivileges= (PR_SET_NO_NEW_PRIVS);
- MemoryDenyWriteExecute= twice over: systemd's own seccomp rules (mmap W|X, mprotect and
  pkey_mprotect with PROT_EXEC, shmat SHM_EXEC -> EPERM) and the kernel's
  prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN);
- SystemCallFilter= through libseccomp: the allow list that `systemd-analyze syscall-filter`
  (systemd 252, tests/fixtures/systemd/syscall-filter-252.txt) gives for the unit's lines,
  anything else kills the process, as in the unit; RestrictAddressFamilies=: socket() of other
  families fails with EAFNOSUPPORT; SystemCallArchitectures=native (libseccomp's default).
Not applied (they need systemd, a cgroup of its own or a fresh /proc): ProtectProc=,
RestrictNamespaces=, RestrictRealtime=, RestrictSUIDSGID=, LockPersonality=, KeyringMode=,
RemoveIPC=, ProtectClock=, ProtectHostname=, ProtectKernelModules=, ProtectKernelLogs=
(capabilities are gone with setuid, which covers the last four's main point).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import grp
import os
import pwd
import shlex
import signal
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from servefleet_dev.testing.sandbox_model import (  # noqa: E402
    CLOSED_BASE_PATHS,
    DeviceTable,  # noqa: E402
    allowed,
    syscall_allow_list,
    syscall_groups,
)

SYSCALLS = REPO / "tests" / "fixtures" / "systemd" / "syscall-filter-252.txt"
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"
FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_MOVE = 32, 1024, 2048, 4096, 8192
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
CLONE_NEWNS = 0x00020000
PR_SET_NO_NEW_PRIVS, PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 38, 65, 1


def log(msg: str) -> None:
    print(f"sandbox_exec: {msg}", file=sys.stderr, flush=True)


def check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def mount(src, target, fstype, flags, data=None) -> None:
    enc = lambda v: v.encode() if isinstance(v, str) else v  # noqa: E731
    check(
        libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f"mount {src} {target} {fstype} {flags:#x}",
    )


# --- the unit file -------------------------------------------------------------------------------


def parse_unit(text: str) -> dict[str, list[str]]:
    """[Service] settings -> values in order (continuation lines joined, comments dropped)."""
    settings: dict[str, list[str]] = {}
    section, pending = None, ""
    for raw in text.splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]" and "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def command(value: str) -> tuple[str, list[str]]:
    """An Exec line -> (prefixes, argv), specifiers %% and $$ unescaped."""
    prefixes = ""
    while value and value[0] in "@-:+!":
        prefixes, value = prefixes + value[0], value[1:]
    argv = [w.replace("%%", "%").replace("$$", "$") for w in shlex.split(value)]
    return prefixes, argv


def environment(unit: dict[str, list[str]], extra: list[str], user: pwd.struct_passwd) -> dict:
    env = {
        "USER": user.pw_name,
        "LOGNAME": user.pw_name,
        "SHELL": user.pw_shell,
        "HOME": user.pw_dir,
        "PATH": SYSTEMD_PATH,
    }
    for value in unit.get("Environment", []):
        for word in shlex.split(value):
            key, _, val = word.partition("=")
            env[key] = val
    for word in extra:
        key, _, val = word.partition("=")
        env[key] = val
    return env


# --- the pieces of the sandbox -------------------------------------------------------------------


def mount_flags(options: str) -> int:
    flags = 0
    for opt, bit in (
        ("nosuid", MS_NOSUID),
        ("nodev", MS_NODEV),
        ("noexec", MS_NOEXEC),
        ("noatime", MS_NOATIME),
        ("nodiratime", MS_NODIRATIME),
        ("relatime", MS_RELATIME),
        ("strictatime", MS_STRICTATIME),
    ):
        if opt in options.split(","):
            flags |= bit
    return flags


def mounts() -> list[tuple[str, str]]:
    """(mount point, per-mount options) from /proc/self/mountinfo, in mount order."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        found.append((point, fields[5]))
    return found


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def private_dev(unit_text: str) -> list[str]:
    """A /dev holding what DevicePolicy=closed + DeviceAllow= allow here; returns what it holds."""
    table = DeviceTable.of_this_machine()
    majors, exact = allowed(unit_text, table)
    keep = [p for p in CLOSED_BASE_PATHS if os.path.exists(p)]
    keep += [p for p, mm in sorted(table.nodes.items()) if mm[0] in majors or mm in exact]
    stage = tempfile.mkdtemp(prefix="sfdev.", dir="/tmp")
    mount("tmpfs", stage, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=1m")
    for path in keep:
        target = stage + path.removeprefix("/dev")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        Path(target).touch()
        mount(path, target, None, MS_BIND)
    for name in ("shm", "pts", "mqueue"):
        os.makedirs(f"{stage}/{name}", exist_ok=True)
    mount("tmpfs", f"{stage}/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    try:
        mount(
            "devpts",
            f"{stage}/pts",
            "devpts",
            MS_NOSUID | MS_NOEXEC,
            "newinstance,ptmxmode=0666,mode=620",
        )
    except OSError as exc:
        log(f"no private /dev/pts ({exc}): the engines need no terminal")
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{stage}/{name}")
    mount(stage, "/dev", None, MS_MOVE)
    return keep


def hide(paths) -> None:
    """InaccessiblePaths=: an empty mode-000 read-only directory (or file) over each path, as
    systemd's /run/systemd/inaccessible/ nodes are; `-` in front: a missing path is no error."""
    for word in paths:
        optional, path = word.startswith("-"), word.lstrip("-")
        if not os.path.lexists(path):
            if optional:
                continue
            raise OSError(errno.ENOENT, "InaccessiblePaths=", path)
        if os.path.isdir(path):
            mount(
                "tmpfs",
                path,
                "tmpfs",
                MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "mode=000,size=4k",
            )
        else:
            empty = "/run/sandbox-exec-inaccessible"
            with open(empty, "w"):
                pass
            os.chmod(empty, 0)
            mount(empty, path, None, MS_BIND)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
        log(f"hidden: {path}")


def mount_namespace(unit: dict[str, list[str]], unit_text: str) -> None:
    check(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    devices = private_dev(unit_text)
    log(f"/dev holds {len(devices)} nodes: {' '.join(devices)}")
    writable = [p for v in unit.get("ReadWritePaths", []) for p in v.split()]
    for path in writable:
        mount(path, path, None, MS_BIND | MS_REC)
    if Path("/proc/sys").is_dir():
        mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)
    for point, options in mounts():
        keep_rw = (
            any(under(point, w) for w in writable)
            or under(point, "/dev")
            or (under(point, "/proc") and not under(point, "/proc/sys"))
        )
        if keep_rw:
            continue
        try:
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | mount_flags(options))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES):  # hidden/overmounted points
                raise
    hide(p for v in unit.get("InaccessiblePaths", []) for p in v.split())
    for path in ("/tmp", "/var/tmp"):  # PrivateTmp=
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for path in ("/home", "/root", "/run/user"):  # ProtectHome=yes
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=755")


class ScmpArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


# MemoryDenyWriteExecute= as systemd 252 builds it (src/shared/seccomp-util.c,
# seccomp_memory_deny_write_execute): EPERM for mmap() asking PROT_WRITE|PROT_EXEC together,
# mprotect()/pkey_mprotect() asking PROT_EXEC at all, shmat() with SHM_EXEC.
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 4, 7
MDWE_RULES = {  # syscall: (argument, mask, the masked values that stay allowed)
    "mmap": (2, PROT_WRITE | PROT_EXEC, (0, PROT_WRITE, PROT_EXEC)),
    "mprotect": (2, PROT_EXEC, (0,)),
    "pkey_mprotect": (2, PROT_EXEC, (0,)),
    "shmat": (2, SHM_EXEC, (0,)),
}


def seccomp_filter(names: set[str], families: set[int] | None, mdwe: bool) -> int:
    """Load the allow list (names), RestrictAddressFamilies= (families) and, with mdwe,
    MemoryDenyWriteExecute= as systemd's filter has it; returns the rule count."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ScmpArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    kill_process, allow = 0x80000000, 0x7FFF0000
    eafnosupport = 0x00050000 | errno.EAFNOSUPPORT
    eperm = 0x00050000 | errno.EPERM
    ctx = lib.seccomp_init(kill_process)
    if not ctx:
        raise OSError("seccomp_init failed")
    rules = 0
    for name in sorted(names):
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            continue  # not a system call of this architecture
        if mdwe and name in MDWE_RULES:
            arg, mask, allowed_values = MDWE_RULES[name]
            for value in range(0, mask + 1):
                if value & ~mask:
                    continue
                cmp = ScmpArgCmp(arg, SCMP_CMP_MASKED_EQ, mask, value)
                action = allow if value in allowed_values else eperm
                check(
                    lib.seccomp_rule_add_array(ctx, action, nr, 1, ctypes.byref(cmp)),
                    f"seccomp rule {name}({value:#x})",
                )
            rules += 1
            continue
        if name == "socket" and families is not None:
            for family in range(0, 46):
                cmp = ScmpArgCmp(0, SCMP_CMP_EQ, family, 0)
                action = allow if family in families else eafnosupport
                check(
                    lib.seccomp_rule_add_array(ctx, action, nr, 1, ctypes.byref(cmp)),
                    f"seccomp rule socket({family})",
                )
            rules += 1
            continue
        if lib.seccomp_rule_add_array(ctx, allow, nr, 0, None) == 0:
            rules += 1
    check(lib.seccomp_load(ctx), "seccomp_load")
    return rules


def drop_privileges(unit: dict[str, list[str]]) -> pwd.struct_passwd:
    user = pwd.getpwnam(unit["User"][-1])
    gid = grp.getgrnam(unit["Group"][-1]).gr_gid if unit.get("Group") else user.pw_gid
    os.setgroups([])
    os.setgid(gid)
    os.setuid(user.pw_uid)
    return user


def sandboxed(
    unit: dict[str, list[str]],
    unit_text: str,
    argv: list[str],
    env_extra: list[str],
    mdwe: bool,
    mounts_too: bool = True,
) -> int:
    """Fork a child that enters the sandbox and execs argv; returns the child's pid."""
    user = pwd.getpwnam(unit["User"][-1])
    env = environment(unit, env_extra, user)
    # Read before the sandbox hides them (the checkout may live under /root).
    names = syscall_allow_list(unit_text, syscall_groups(SYSCALLS.read_text()))
    families = None
    if unit.get("RestrictAddressFamilies"):
        families = {FAMILIES[f] for f in unit["RestrictAddressFamilies"][-1].split()}
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setsid()
        if mounts_too:
            mount_namespace(unit, unit_text)
        drop_privileges(unit)
        check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
        if mdwe:
            check(libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0), "PR_SET_MDWE")
        os.umask(int(unit.get("UMask", ["0022"])[-1], 8))
        os.chdir(unit.get("WorkingDirectory", [user.pw_dir])[-1])
        rules = seccomp_filter(names, families, mdwe)
        os.write(
            2,
            f"sandbox_exec: [{os.getpid()}] as {user.pw_name}, mdwe {mdwe}, {rules} "
            f"system calls allowed: {shlex.join(argv)}\n".encode(),
        )
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # noqa: BLE001 (the child must never return)
        os.write(2, f"sandbox_exec: could not enter the sandbox: {exc}\n".encode())
        os._exit(125)


def wait(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        log(
            f"[{pid}] killed by signal {sig} ({signal.Signals(sig).name})"
            + (": a system call outside SystemCallFilter=" if sig == signal.SIGSYS else "")
        )
        return 128 + sig
    return os.WEXITSTATUS(status)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("unit_file")
    ap.add_argument("--mdwe", choices=["on", "off", "unit"], default="unit")
    ap.add_argument("--setenv", action="append", default=[], help="probe-only additions, K=V")
    ap.add_argument(
        "--no-mount-namespace",
        dest="mounts",
        action="store_false",
        help="where the machine refuses unshare(CLONE_NEWNS): no read-only tree, "
        "private /tmp or /dev (said in the log)",
    )
    ap.add_argument("--argv", nargs=argparse.REMAINDER, help="run this instead of ExecStart=")
    args = ap.parse_args(argv)
    text = Path(args.unit_file).read_text()
    unit = parse_unit(text)
    mdwe = {"on": True, "off": False}.get(
        args.mdwe, unit.get("MemoryDenyWriteExecute", ["no"])[-1] == "yes"
    )
    for value in unit.get("ExecStartPre", []):
        prefixes, pre = command(value)
        if "+" in prefixes:
            if not os.path.exists(pre[0]) and "-" in prefixes:
                log(f"ExecStartPre={value}: {pre[0]} is not here ('-': tolerated)")
                continue
            rc = os.spawnv(os.P_WAIT, pre[0], pre)
        else:
            rc = wait(sandboxed(unit, text, pre, args.setenv, mdwe, args.mounts))
        log(f"ExecStartPre={value}: rc {rc}")
        if rc != 0 and "-" not in prefixes:
            return rc
    _, main_argv = command(unit["ExecStart"][-1]) if not args.argv else ("", args.argv)
    if not args.mounts:
        log(
            "NOT applied: the mount namespace (ProtectSystem, ReadWritePaths, PrivateTmp, "
            "ProtectHome, the /dev of DevicePolicy): unshare(CLONE_NEWNS) is refused here"
        )
    pid = sandboxed(unit, text, main_argv, args.setenv, mdwe, args.mounts)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, _f: os.killpg(pid, s))
    rc = wait(pid)
    log(f"ExecStart: rc {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
