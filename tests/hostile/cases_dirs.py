"""servefleet's directories match exact rules (#27 rule 2, core/validate.py DEDICATED_PLACES and
core/data.py layout_problems): servefleet_root, models_root and depot_store are servefleet or
servefleet-NAME (or its models/depot) directly in /opt, /srv, /var/lib, /var/opt, or one to
three plain names in /data, /mnt, /scratch; never each other's, never another tree's. Each value
is refused in the data, before any connection, naming its key; the operator's files are
unchanged (the data is validated where it is read)."""

from __future__ import annotations

from tests.hostile.cases_data import case

CATEGORY = "directories"


def place(name: str, key: str, value: str, expected: str | None = None, **extra):
    c = case(name, {key: value, **extra}, expected or f"'{key}' = {value!r}")
    return type(c)(CATEGORY, c.name, c.expect, c.check)


CASES = [
    place(
        "servefleet_root climbing out with ..", "servefleet_root", "/var/lib/servefleet/../docker"
    ),
    place("servefleet_root: servefleet- with no name", "servefleet_root", "/opt/servefleet-"),
    place(
        "servefleet_root: a Cyrillic e in servefleet", "servefleet_root", "/opt/servef\u0435leet"
    ),
    place(
        "servefleet_root: a bidi control in the name", "servefleet_root", "/opt/servefleet\u202e"
    ),
    place("servefleet_root: two levels down in /opt", "servefleet_root", "/opt/vendor/servefleet"),
    place(
        "servefleet_root: inside /var/lib/docker", "servefleet_root", "/var/lib/docker/servefleet"
    ),
    place("servefleet_root: a mount point itself", "servefleet_root", "/scratch"),
    place("models_root: four levels in /data", "models_root", "/data/a/b/c/d"),
    place("models_root: a name starting with '-'", "models_root", "/mnt/-rf"),
    place("models_root: a hidden name", "models_root", "/mnt/.cache"),
    place("models_root: a trailing slash", "models_root", "/data/models/"),
    place("models_root: //data", "models_root", "//data/models"),
    place("depot_store: /home/ops/depot", "depot_store", "/home/ops/depot"),
    place("depot_store: /var/lib/cloud/scripts", "depot_store", "/var/lib/cloud/scripts"),
    place(
        "models_root: servefleet_root's bin/",
        "models_root",
        "/opt/servefleet/bin",
        "'models_root' = '/opt/servefleet/bin'",
    ),
    place(
        "depot_store: the models root itself",
        "depot_store",
        "/data/models",
        "overlap",
        models_root="/data/models",
    ),
]
