"""What a node is, as pure parsers of command output and the preflight rules on top of them.

The facts (servefleet.facts.node) run the commands; the parsers here are unit-tested on real
output (tests/fixtures/, an H200's nvidia-smi among them).
"""

from __future__ import annotations

from dataclasses import dataclass

from servefleet.core.errors import DataError
from servefleet.core.validate import inside


def parse_os_release(lines: list[str]) -> dict:
    """/etc/os-release as a dict, plus `family` (its ID: debian, ubuntu, ...)."""
    info = {}
    for line in lines:
        if "=" in line:
            key, _, value = line.partition("=")
            info[key.strip().lower()] = value.strip().strip('"')
    info["family"] = info.get("id", "unknown")
    return info


def parse_installed_debs(lines: list[str]) -> set[str]:
    """Names whose dpkg status is ``ii`` (installed, no error) from ``dpkg-query -W -f='${db:
    Status-Abbrev} ${Package}\n'``: a package removed with its configuration kept is ``rc``."""
    found = set()
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0] == "ii":
            found.add(parts[1].split(":")[0])  # git:amd64 on multi-arch nodes
    return found


def parse_account(lines: list[str]) -> dict:
    """``{"user": {name, uid, gid, gecos, home, shell} | None, "group": {name, gid, members} |
    None, "groups": [the user's groups, primary first]}`` from ``getent passwd`` / ``getent
    group`` / ``id -Gn`` lines prefixed ``passwd:`` / ``group:`` / ``groups:``."""
    found: dict = {"user": None, "group": None, "groups": []}
    for line in lines:
        kind, _, entry = line.partition(":")
        fields = entry.split(":")
        if kind == "passwd" and len(fields) == 7:
            found["user"] = {
                "name": fields[0],
                "uid": fields[2],
                "gid": fields[3],
                "gecos": fields[4],
                "home": fields[5],
                "shell": fields[6],
            }
        elif kind == "group" and len(fields) >= 3:
            members = fields[3].split(",") if len(fields) > 3 and fields[3] else []
            found["group"] = {"name": fields[0], "gid": fields[2], "members": members}
        elif kind == "groups":
            found["groups"] = entry.split()
    return found


# The comment (GECOS) of every account servefleet creates: how a later run knows it as its own.
OWN_ACCOUNT = "servefleet service account"


def account_problem(key: str, name: str, found: dict, home: str, shell: str) -> str | None:
    """Whether the account `name` (data key `key`) is servefleet's to create or keep.

    The service accounts are the tool's own: created by it (GECOS OWN_ACCOUNT, a primary group
    of the same name), and in no other group, so the engine's identity holds no group power
    (docker, lxd, video, systemd-journal, ...) and no one else's files. Absent (account and
    group): servefleet creates it. An account that an earlier servefleet created (no comment,
    its own group, the home and shell servefleet gives it) is adopted once. Anything else that
    exists is refused: None when fine, else the problem in one line."""
    user, group = found.get("user"), found.get("group")
    what = f"key {key!r} = {name!r}"
    if user is None:
        if group is None:
            return None
        return (
            f"{what}: a group {name!r} (gid {group['gid']}) exists on this node and is not "
            f"servefleet's; expected a name that no account or group has yet"
        )
    if user["gecos"] not in (OWN_ACCOUNT, "") or (
        user["gecos"] == "" and (user["home"], user["shell"]) != (home, shell)
    ):
        return (
            f"{what}: an account {name!r} (uid {user['uid']}) exists on this node and is not "
            f"servefleet's; expected a name that no account or group has yet"
        )
    if group is None or group["gid"] != user["gid"]:
        return (
            f"{what}: the account's primary group is not its own group {name!r}; expected "
            f"servefleet's own account and group"
        )
    others = [g for g in found.get("groups") or [] if g != name] + [
        m for m in group.get("members") or [] if m != name
    ]
    if others:
        return (
            f"{what}: the account is in other groups or its group has other members "
            f"({', '.join(sorted(set(others)))[:200]}); servefleet's service account is in "
            f"no group but its own"
        )
    return None


def parse_path_stat(lines: list[str]) -> dict | None:
    """``stat -c '%F|%U|%G|%a'`` as {type, user, group, mode}; None when the path is absent."""
    fields = (lines[0] if lines else "").strip().split("|")
    if len(fields) != 4:
        return None
    kind, user, group, mode = fields
    return {"type": kind, "user": user, "group": group, "mode": mode}


# One line per existing component of a path (the path, then each directory above it up to /),
# not following symlinks: W for the path as written, R for the path it resolves to.
PATH_CHAIN_FORMAT = "%F|%u|%U|%a|%n"


def parse_path_chain(lines: list[str]) -> dict | None:
    """``{"W": [...], "R": [...]}`` of {type, uid, user, mode, path} from ``stat -c
    'W|%F|%u|%U|%a|%n'`` lines (servefleet.facts.node.PathChain); None when a line does not
    parse or a chain does not reach / (the read failed: nothing is known)."""
    chains: dict = {"W": [], "R": []}
    for line in lines:
        fields = line.split("|", 5)  # the path last: it may hold a |
        if len(fields) != 6 or fields[0] not in chains or not fields[2].isdigit():
            return None
        which, kind, uid, user, mode, path = fields
        try:
            int(mode, 8)
        except ValueError:
            return None
        chains[which].append(
            {"type": kind, "uid": int(uid), "user": user, "mode": mode, "path": path}
        )
    if any(not chain or chain[-1]["path"] != "/" for chain in chains.values()):
        return None
    return chains


def others_may_write(entry: dict) -> bool:
    """Is `entry` (parse_path_chain) anyone's but root's to change? Its owner is not uid 0, or
    its group or others may write it: a sticky world-writable directory (/tmp) counts, as
    anyone may create a name there that root then follows. A symlink's own owner and mode mean
    nothing (its target is in the resolved chain, its directory in this one)."""
    if entry["type"] == "symbolic link":
        return False
    return entry["uid"] != 0 or bool(int(entry["mode"], 8) & 0o022)


def root_only_problem(key: str, path: str, chains: dict | None) -> str | None:
    """Why root must not install from, run or compile with `path` (data key `key`): the first
    component of it, or of what it resolves to, that another user can change; None when only
    root can. A path that does not exist yet is judged by the directories above it (root
    makes it)."""
    if chains is None:
        return f"{key} = {path}: cannot read the owner and mode of it and the directories above it"
    for entry in chains["W"] + chains["R"]:
        if others_may_write(entry):
            what = "it" if entry["path"] == path else entry["path"]
            return (
                f"{key} = {path}: {what} is owned by {entry['user']} (uid {entry['uid']}), "
                f"mode {entry['mode'].zfill(4)} ({entry['type']}); root installs from or "
                f"runs what is there, so it and every directory above it must be root's and "
                f"writable by root only"
            )
    return None


def own_dir_problem(
    key: str, path: str, marker: str, chains: dict | None, earlier: bool
) -> str | None:
    """Whether servefleet may make `path` (data key `key`) its own directory, from the owner
    and mode of its marker, itself and each directory above it (parse_path_chain of `marker`).

    Every directory above it is root's and writable by root only (a 1777 /scratch is not), and
    none of them is a symlink. The directory itself does not exist yet (root makes it), or is
    servefleet's: it holds `marker`, a regular file root wrote and only root may change.
    `earlier`: it is what an earlier servefleet made before markers existed (the caller's
    witness); it is adopted once, and the tree step marks it. Anything else that exists is
    someone else's (/var/lib/docker, /opt/nvidia): None when fine, else the problem in one
    line."""
    what = f"key {key!r} = {path!r}"
    if chains is None:
        return f"{what}: cannot read the owner and mode of it and the directories above it"
    for entry in chains["W"]:
        if entry["type"] == "symbolic link":
            return (
                f"{what}: {entry['path']} is a symbolic link; servefleet's directories and "
                f"those above them are real directories"
            )
        if inside(path, entry["path"]) and others_may_write(entry):
            return (
                f"{what}: {entry['path']} above it is owned by {entry['user']} (uid "
                f"{entry['uid']}), mode {entry['mode'].zfill(4)}; every directory above "
                f"servefleet's must be root's and writable by root only"
            )
    found = {entry["path"]: entry for entry in chains["W"]}
    own = found.get(path)
    if own is None:
        return None
    if own["type"] != "directory":
        return f"{what}: it is a {own['type']} on this node, not a directory"
    mark = found.get(marker)
    if mark is not None:
        if mark["type"] in ("regular file", "regular empty file") and not others_may_write(mark):
            return None
        return (
            f"{what}: its {marker.rsplit('/', 1)[-1]} is a {mark['type']} owned by "
            f"{mark['user']} (uid {mark['uid']}), mode {mark['mode'].zfill(4)}: not root's "
            f"mark; expected a directory servefleet made"
        )
    if earlier:
        return None
    return (
        f"{what}: {path} exists on this node and is not servefleet's (no "
        f"{marker.rsplit('/', 1)[-1]} that root wrote); expected a directory that does not "
        f"exist yet, or one servefleet made (to hand it an existing one, create that file "
        f"there as root)"
    )


def parse_meminfo(lines: list[str]) -> dict:
    values = {}
    for line in lines:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return {"total": values.get("MemTotal", 0), "available": values.get("MemAvailable", 0)}


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    memory_bytes: int | None  # None where nvidia-smi reports [N/A] (GB10 unified memory)
    driver_version: str
    compute_capability: str | None

    @property
    def driver_major(self) -> int:
        return int(self.driver_version.split(".")[0])


NVIDIA_SMI_QUERY = (
    "nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_cap "
    "--format=csv,noheader,nounits"
)


def _na(value: str) -> str | None:
    value = value.strip()
    return None if value in ("[N/A]", "N/A", "[Not Supported]", "") else value


def parse_nvidia_smi(lines: list[str]) -> list[Gpu]:
    gpus = []
    for line in lines:
        if not line.strip():
            continue
        index, name, memory, driver, cc = (f.strip() for f in line.split(","))
        mib = _na(memory)
        gpus.append(
            Gpu(
                index=int(index),
                name=name,
                memory_bytes=int(float(mib)) * 1024**2 if mib else None,
                driver_version=driver,
                compute_capability=_na(cc),
            )
        )
    return gpus


def node_problems(*, arch: str, gpus: list[Gpu], free_disk: int, data) -> list[str]:
    """What makes this node unfit for its recipe; [] when it is fit."""
    problems = []
    expected = data.get("expected_arch")
    if expected and arch != expected:
        problems.append(f"CPU architecture is {arch}, the recipe is built for {expected}")
    if data.get("require_gpu"):
        if not gpus:
            problems.append(
                "no NVIDIA GPU found (nvidia-smi missing or lists none); install the "
                "driver, or set require_gpu = False for a host without one"
            )
        else:
            minimum = data.get("min_driver_version")
            old = [g for g in gpus if g.driver_major < minimum]
            if old:
                problems.append(
                    f"NVIDIA driver {old[0].driver_version} is older than the "
                    f"recipe's minimum {minimum}; upgrade the driver"
                )
    # The node class's floor (base tree, an engine's install) and the model's (its weights).
    need = (data.get("min_free_disk_bytes") or 0) + (data.get("model_min_free_disk_bytes") or 0)
    if free_disk < need:
        problems.append(
            f"{free_disk / 1024**3:.1f} GiB free under {data.get('servefleet_root')}, "
            f"need {need / 1024**3:.1f} GiB"
        )
    return problems


def usable_memory(data, memory: dict, gpus: list[Gpu]) -> int:
    """Memory the engine may plan with: data's usable_memory_bytes wins; else as the node class's
    memory_model says. Unified (GB10: nvidia-smi reports no GPU memory): system memory.
    Discrete: the smallest GPU's memory as nvidia-smi reports it, else the class's
    gpu_memory_bytes (a 4090 on the testbed: no GPU to ask), else system memory."""
    if data.get("usable_memory_bytes"):
        return data["usable_memory_bytes"]
    if data.get("memory_model", "discrete") == "unified":
        return memory["total"]
    sized = [g.memory_bytes for g in gpus if g.memory_bytes]
    if sized:
        return min(sized)
    return data.get("gpu_memory_bytes") or memory["total"]


def per_family(data, key: str, family: str, host_name: str):
    """A per-distro-family table's entry for this host; DataError naming the missing family."""
    table = data.get(key) or {}
    if family not in table:
        raise DataError(
            f"invalid data for host {host_name}: key {key!r} has no entry for this host's OS "
            f"family {family!r}; expected one of {sorted(table)} or add {family!r}; nothing was "
            f"changed"
        )
    return table[family]
