"""Facts about systemd units: one `systemctl show` per unit for everything servefleet asks."""

from __future__ import annotations

import shlex
from typing import TypedDict

from pyinfra.api import FactBase

from servefleet.core.layout import UNIT_DIR

_PROPS = (
    "LoadState",
    "ActiveState",
    "SubState",
    "UnitFileState",
    "NRestarts",
    "InvocationID",
    "ExecMainStatus",
)


class UnitStatus(TypedDict):
    exists: bool  # LoadState=loaded
    active: bool  # ActiveState=active
    enabled: bool  # UnitFileState=enabled or enabled-runtime
    active_state: str
    sub_state: str
    restarts: int  # NRestarts
    invocation: str  # InvocationID


class UnitState(FactBase[UnitStatus]):
    """{"exists", "active", "enabled", "active_state", "sub_state", "restarts", "invocation"}
    of one unit (UnitStatus)."""

    def command(self, unit: str) -> str:
        props = ",".join(_PROPS)
        return f"systemctl show -p {props} {shlex.quote(unit)} 2>/dev/null || true"

    def process(self, output: list[str]) -> UnitStatus:
        raw = dict(line.split("=", 1) for line in output if "=" in line)
        return {
            "exists": raw.get("LoadState") == "loaded",
            "active": raw.get("ActiveState") == "active",
            "enabled": raw.get("UnitFileState") in ("enabled", "enabled-runtime"),
            "active_state": raw.get("ActiveState", ""),
            "sub_state": raw.get("SubState", ""),
            "restarts": int(raw["NRestarts"]) if raw.get("NRestarts", "").isdigit() else 0,
            "invocation": raw.get("InvocationID", ""),
        }

    @staticmethod
    def default() -> UnitStatus:
        return {
            "exists": False,
            "active": False,
            "enabled": False,
            "active_state": "",
            "sub_state": "",
            "restarts": 0,
            "invocation": "",
        }


class ServefleetUnits(FactBase[list[str]]):
    """Unit files servefleet installed: servefleet-*.service in systemd's unit directory."""

    default = list

    def command(self) -> str:
        return f"ls -1 {UNIT_DIR}/ | grep '^servefleet-.*\\.service$' || true"

    def process(self, output: list[str]) -> list[str]:
        return [line.strip() for line in output if line.strip()]
