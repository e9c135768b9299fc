"""Models: the operator-side hub client, the VerifiedModel parser, the node-side fetch script
(run here against a local hub with the real `hf` CLI), the depot's data and fleet key."""

import base64
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from servefleet.core import fleetkey, models
from servefleet.core.errors import DataError
from servefleet.facts.models import ModelRecordFiles
from servefleet.fleet import contract
from servefleet.fleet.data import HostData, Layer, validate
from servefleet_dev import hub
from servefleet_dev.testbed.material import load as group_data
from servefleet_dev.testing.tiny_models import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]
REPO = "acme/tiny-model"
HF = Path(sys.executable).with_name("hf")
needs_hf_cli = pytest.mark.skipif(not HF.exists(), reason="hf CLI not installed next to python")


def _load_script():
    spec = importlib.util.spec_from_file_location(
        "fetch_model", ROOT / "files/model/fetch_model.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fm = _load_script()


def check(data: dict, groups=("depot",), recipe="model") -> dict:
    return validate(HostData("h", list(groups), [Layer("group_data", data)]), recipe)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    base = tmp_path_factory.mktemp("models")
    src = build_tiny_checkpoint(base / "src")
    (src / "README.md").write_text("tiny\n")
    root = base / "store"
    sha = hub.publish(root, REPO, src)
    return {"root": root, "sha": sha, "src": src}


@pytest.fixture(scope="module")
def url(store):
    with hub.running_hub(store["root"]) as url:
        yield url


# -- data --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "groups",
    [
        ("all", "spark", "vllm"),
        ("all", "depot", "testbed_depot"),
        ("all", "depot", "testbed_depot", "testbed"),
    ],
)
def test_shipped_defaults_pass_the_model_and_depot_keys(groups):
    data = group_data(*groups)
    # DataError (one line) on a bad default; the model deploy runs from the data as given.
    model = check({**data, "model_repo": "org/name"}, groups[1:], "model")
    assert model == {**data, "model_repo": "org/name"}
    if "depot" in groups:
        assert check(data, groups[1:], "depot") == data


def test_the_model_deploy_needs_a_repo():
    with pytest.raises(DataError, match="'model_repo' is missing; deploys/model.py needs"):
        check(group_data("all"))


@pytest.mark.parametrize(
    "key,value",
    [
        ("model_include", []),
        ("model_include", "*.json"),
        ("model_revision", "main branch"),
        ("model_repo", "no-slash"),
        ("model_repo", "org/.."),
        ("model_revision", "../x"),
        ("models_root", "relative/dir"),
        ("models_root", "/etc"),
        ("models_root", "/"),
    ],
)
def test_bad_model_data_is_named(key, value):
    data = {**group_data("all"), "model_repo": "org/name", key: value}
    with pytest.raises(DataError, match=f"'{key}'"):
        check(data)


@pytest.mark.parametrize(
    "value,ok",
    [
        ([], True),
        ([{"repo_id": "org/name"}], True),
        ([{"repo_id": "org/name", "revision": "a" * 40, "include": ["*.gguf"]}], True),
        ([{"repo_id": "org/name", "include": []}], False),
        ([{"repo": "org/name"}], False),
        ({"repo_id": "org/name"}, False),
    ],
)
def test_depot_models_check(value, ok):
    assert contract.BY_NAME["depot_models"].check.ok(value) is ok


def test_depot_models_defaults():
    data = {
        "depot_models": [
            {"repo_id": "org/a"},
            {"repo_id": "org/b", "revision": "v1", "include": ["*.gguf"]},
        ]
    }
    assert fleetkey.depot_models(data) == [
        {"repo_id": "org/a", "revision": "main", "include": ["*"]},
        {"repo_id": "org/b", "revision": "v1", "include": ["*.gguf"]},
    ]


# -- the operator-side hub client ------------------------------------------------------------


def test_hub_commit_resolves_branch_and_lists_lfs_sha256(store, url):
    commit = models.hub_commit(url, REPO, "main")
    assert commit.sha == store["sha"]
    by_path = {f.path: f for f in commit.files}
    shard = "model.safetensors-00001-of-00002.safetensors"
    data = (store["src"] / shard).read_bytes()
    assert by_path[shard].sha256 == hashlib.sha256(data).hexdigest()
    assert by_path[shard].size == len(data)
    assert by_path["config.json"].sha256 is None and len(by_path["config.json"].oid) == 40
    # A pinned sha needs no revision lookup and gives the same listing.
    assert models.hub_commit(url, REPO, store["sha"]).files == commit.files


def test_include_patterns_follow_huggingface_hub(store, url):
    commit = models.hub_commit(url, REPO, "main")
    names = lambda inc: sorted(f.path for f in commit.select(inc))  # noqa: E731
    assert names(["*.json"]) == ["config.json", "model.safetensors.index.json"]
    assert names(["*"]) == sorted(f.path for f in commit.files)
    assert names(["nothing*"]) == []
    for patterns in (["*.json"], ["*.safetensors", "README.md"], ["*"]):
        for f in commit.files:
            assert fm.matches(f.path, patterns) == (f.path in names(patterns))


def test_hub_errors_are_clear_and_never_show_the_token(store):
    secret = "hf_SECRETsecret0123456789"
    with hub.running_hub(store["root"], token=secret) as url:
        with pytest.raises(models.HubError, match="no token was given"):
            models.hub_commit(url, REPO, "main")
        with pytest.raises(models.HubError, match="refused") as err:
            models.hub_commit(url, REPO, "main", "hf_wrong")
        assert "hf_wrong" not in str(err.value)
        assert models.hub_commit(url, REPO, "main", secret).sha == store["sha"]
    with hub.running_hub(store["root"]) as url:
        with pytest.raises(models.HubError, match="revision not found"):
            models.hub_commit(url, REPO, "no-such-branch")
    with pytest.raises(models.HubError, match="cannot reach the hub"):
        models.hub_commit("http://127.0.0.1:9", REPO, "main", timeout=2)


def test_next_link():
    link = '<https://hub/api/models/a/b/tree/x?cursor=abc>; rel="next"'
    assert models._next_link(link) == "https://hub/api/models/a/b/tree/x?cursor=abc"
    assert models._next_link(None) is None
    assert models._next_link('<https://x>; rel="prev"') is None


def test_operator_token_prefers_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "from-env-0123")
    assert models.operator_token({"hf_token_file": None}, "h") == "from-env-0123"
    path = tmp_path / "token"
    path.write_text("from-file-0123\n")
    assert models.operator_token({"hf_token_file": str(path)}, "h") == "from-file-0123"
    monkeypatch.delenv("HF_TOKEN")
    assert models.operator_token({}, "h") is None


# -- the VerifiedModel fact's parser ------------------------------------------------------------


RECORD = {
    "repo_id": "org/name",
    "revision": "main",
    "sha": "a" * 40,
    "include": ["*"],
    "files": {"config.json": 10, "w/model.safetensors": 2000},
}


def _fact_output(record, sizes):
    """What VerifiedModel's command prints: the record's bytes and the NUL-separated listing
    (`find -printf '%s %P\\0'`), each base64-encoded on one line."""
    listing = b"".join(f"{s} ".encode() + os.fsencode(p) + b"\0" for p, s in sizes.items())
    return [
        base64.b64encode(json.dumps(record, indent=1).encode()).decode(),
        models.SIZES_MARKER,
        base64.b64encode(listing).decode(),
    ]


def test_names_reach_the_reason_whole_whatever_bytes_they_hold():
    # Not UTF-8, and a newline that would have forged a listing line ("10 model.safetensors").
    sizes = {
        "config.json": 10,
        "w/model.safetensors": 2000,
        os.fsdecode(b"bad\xffname.py"): 1,
        "config.json\n10 model.safetensors": 1,
    }
    assert models.parse_verified(_fact_output(RECORD, sizes)) is None
    record, on_disk = models.split_record(_fact_output(RECORD, sizes))
    assert models.invalid_record_reason(record, on_disk) == (
        "not part of the model: bad\\xffname.py, config.json\\n10 model.safetensors"
    )


def test_a_listing_cut_short_never_verifies():
    lines = _fact_output(RECORD, {"config.json": 10, "w/model.safetensors": 2000})
    lines[-1] = lines[-1][:-3] + "#"
    assert models.parse_verified(lines) is None
    assert "could not be read" in models.invalid_record_reason(*models.split_record(lines))


def test_verified_record_is_returned_when_files_are_intact():
    out = _fact_output(RECORD, {"config.json": 10, "w/model.safetensors": 2000})
    assert models.parse_verified(out) == RECORD


def test_a_file_the_record_does_not_list_voids_it_and_is_named():
    # A planted extra shard or *.py next to a verified model would be loaded with it.
    sizes = {"config.json": 10, "w/model.safetensors": 2000, "evil.py": 5}
    assert models.parse_verified(_fact_output(RECORD, sizes)) is None
    record, on_disk = models.split_record(_fact_output(RECORD, sizes))
    assert models.invalid_record_reason(record, on_disk) == "not part of the model: evil.py"


@pytest.mark.parametrize(
    "sizes", [{"config.json": 10}, {"config.json": 10, "w/model.safetensors": 1999}]
)
def test_missing_or_truncated_file_voids_the_record(sizes):
    assert models.parse_verified(_fact_output(RECORD, sizes)) is None


def test_no_record():
    assert models.parse_verified([]) is None
    assert models.parse_verified(["garbage", models.SIZES_MARKER]) is None


def test_satisfies():
    assert models.satisfies(RECORD, "org/name", "a" * 40, ["*"])
    assert not models.satisfies(RECORD, "org/name", "b" * 40, ["*"])
    assert not models.satisfies(RECORD, "org/name", "a" * 40, ["*.json"])
    assert not models.satisfies(None, "org/name", "a" * 40, ["*"])


# -- the node-side script, run here ------------------------------------------------------------


def test_disk_preflight_counts_only_what_is_missing():
    expected = {"a": 100, "b": 50}
    assert fm.bytes_to_fetch(expected, {"a": 100}) == 50
    assert fm.bytes_to_fetch(expected, {"a": 99}) == 150
    assert fm.disk_problem(expected, {"a": 100}, free=60, margin=10) is None
    problem = fm.disk_problem(expected, {}, free=100, margin=10)
    assert "needed" in problem and "free" in problem


def _request(commit, dest, url, include=("*",), margin=0, token_file=None, tmp=None):
    return {
        "source": "hub",
        "repo_id": REPO,
        "revision": "main",
        "sha": commit.sha,
        "include": list(include),
        "dest": str(dest),
        "root": str(Path(dest).parent),
        "margin_bytes": margin,
        "endpoint": url,
        "files": [f.to_json() for f in commit.select(list(include))],
        "hf": str(HF),
        "hf_home": str(tmp / "hf-home"),
        "token_file": token_file,
    }


@needs_hf_cli
def test_script_fetches_verifies_and_records(store, url, tmp_path):
    commit = models.hub_commit(url, REPO, "main")
    dest = tmp_path / "model"
    (dest / "stale.bin").parent.mkdir(parents=True)
    (dest / "stale.bin").write_bytes(b"old revision")
    req = _request(commit, dest, url, include=["*.json", "*.safetensors"], tmp=tmp_path)
    doc = fm.run(req)
    assert doc["sha"] == store["sha"] and not (dest / "stale.bin").exists()
    assert set(doc["files"]) == {f.path for f in commit.select(["*.json", "*.safetensors"])}
    for path, digest in doc["sha256"].items():
        assert hashlib.sha256((dest / path).read_bytes()).hexdigest() == digest
    on_disk = json.loads((dest / fm.RECORD).read_text())
    assert on_disk["files"] == doc["files"]


@needs_hf_cli
def test_script_follows_no_symlink_and_reports_root_s_record_on_fd_3(store, url, tmp_path):
    commit = models.hub_commit(url, REPO, "main")
    dest, outside = tmp_path / "model", tmp_path / "outside"
    outside.mkdir()
    victim = outside / "model.safetensors-00001-of-00002.safetensors"
    victim.write_bytes(b"not the engine's to delete")
    (outside / "keep.metadata").write_bytes(b"x")
    dest.mkdir()
    (dest / "sub").symlink_to(outside)  # a planted directory link
    (dest / ".servefleet").symlink_to(outside)  # would send the record outside
    (dest / "passwd.json").symlink_to("/etc/passwd")
    read, write = os.pipe()
    req = {
        **_request(commit, dest, url, include=["*.json", "*.safetensors"], tmp=tmp_path),
        "record_fd": write,
    }
    doc = fm.run(req)
    reported = json.loads(os.read(read, 1 << 20))
    os.close(read)
    assert reported == doc and reported["sha"] == store["sha"]
    assert victim.read_bytes() == b"not the engine's to delete"
    assert sorted(p.name for p in outside.iterdir()) == ["keep.metadata", victim.name]
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    assert (dest / ".servefleet").is_dir() and (dest / fm.RECORD).is_file()


def test_a_delete_through_a_directory_link_is_refused(tmp_path):
    dest, outside = tmp_path / "model", tmp_path / "outside"
    dest.mkdir(), outside.mkdir()
    (outside / "f").write_bytes(b"keep")
    (dest / "d").symlink_to(outside)
    with pytest.raises(fm.Failure, match="symlink or not a directory.*refused"):
        fm.unlink_inside(dest, "d/f")
    assert (outside / "f").read_bytes() == b"keep"


@pytest.mark.parametrize(
    "doc, text",
    [
        ([], "not a JSON object"),
        ({"repo_id": "x", "sha": "a" * 40}, "expected acme/tiny-model@"),
        ({"repo_id": REPO, "sha": "a" * 40, "files": []}, "no files/sha256 objects"),
        (
            {"repo_id": REPO, "sha": "a" * 40, "files": {"a": "1"}, "sha256": {"a": "0" * 64}},
            "size of 'a'",
        ),
        ({"repo_id": REPO, "sha": "a" * 40, "files": {"a": 1}, "sha256": {}}, "sha256 of 'a'"),
        (
            {"repo_id": REPO, "sha": "a" * 40, "files": {"a": True}, "sha256": {"a": "0" * 64}},
            "size of 'a'",
        ),
    ],
)
def test_a_malformed_depot_manifest_is_one_line(doc, text):
    with pytest.raises(fm.Failure, match=text):
        fm.manifest_files(doc, {"repo_id": REPO, "sha": "a" * 40, "include": ["*"]})


@needs_hf_cli
def test_script_refuses_a_corrupt_file_names_it_and_refetches_next_time(store, url, tmp_path):
    commit = models.hub_commit(url, REPO, "main")
    dest = tmp_path / "model"
    req = _request(commit, dest, url, include=["*.safetensors"], tmp=tmp_path)
    fm.run(req)
    shard = "model.safetensors-00002-of-00002.safetensors"
    data = bytearray((dest / shard).read_bytes())
    data[1000] ^= 0xFF  # same size: only the sha256 tells
    (dest / shard).write_bytes(bytes(data))
    (dest / fm.RECORD).unlink()
    with pytest.raises(fm.Failure, match=f"{shard}: sha256"):
        fm.run(req)  # hf keeps the file (its metadata says complete); the hash does not
    assert not (dest / shard).exists() and not (dest / fm.RECORD).exists()
    fm.run(req)
    assert (dest / fm.RECORD).exists()


@needs_hf_cli
def test_script_fails_before_fetching_when_disk_is_short(store, url, tmp_path):
    commit = models.hub_commit(url, REPO, "main")
    dest = tmp_path / "model"
    hub.hub_stats(url, reset=True)
    req = _request(commit, dest, url, margin=10**18, tmp=tmp_path)
    with pytest.raises(fm.Failure, match="not enough free disk.*nothing was fetched"):
        fm.run(req)
    assert hub.hub_stats(url)["total_bytes"] == 0
    assert fm.present_files(dest) == {}


# -- the fleet key -----------------------------------------------------------------------------


def test_fleet_key_is_generated_once(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEFLEET_CACHE", str(tmp_path))
    private, public = fleetkey.fleet_key({}, "h")
    path = tmp_path / "fleet" / "depot_ed25519"
    assert path.stat().st_mode & 0o777 == 0o600
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert public.startswith("ssh-ed25519 ") and public.endswith(" servefleet-fleet")
    assert fleetkey.fleet_key({}, "h") == (private, public)
    assert fleetkey.fleet_key({"depot_ssh_key": str(path)}, "h") == (private, public)


def test_rsync_stats():
    text = (
        "Number of files: 4 (reg: 4)\nLiteral data: 2,680,056 bytes\n"
        "Matched data: 5,678,856 bytes\nTotal bytes received: 2,694,122\n"
    )
    stats = fm.rsync_stats(text)
    assert stats["Matched data"] == 5_678_856 and stats["Total bytes received"] == 2_694_122


def test_model_record_fact_default_when_the_node_has_no_record():
    # pyinfra calls default() on the fact instance when the command printed nothing or failed
    # (a deleted shard): it must give "no record", not raise.
    assert ModelRecordFiles().default() == (None, {})
