"""Byte counts take one set of forms everywhere (core.sizes): fleet.yml's data, --data, group_data
and plan-kv. 8G and 8GiB are both 8 * 2**30; decimal units are refused, not guessed."""

from __future__ import annotations

import pytest
from pyinfra.api import Inventory

from servefleet import cli
from servefleet.core.errors import DataError
from servefleet.core.sizes import SizeError, parse_size
from servefleet.fleet.data import HostData, Layer, serving_digest, settle, validate
from servefleet_dev.testbed.material import load

GiB, MiB = 1 << 30, 1 << 20
SPARK = load("all", "spark", "vllm")


@pytest.mark.parametrize(
    "text,count",
    [
        (8589934592, 8 * GiB),
        ("8589934592", 8 * GiB),
        ("8G", 8 * GiB),
        ("8GiB", 8 * GiB),
        ("512M", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("1.5GiB", 3 * GiB // 2),
        ("1.5G", 3 * GiB // 2),
        ("4K", 4096),
        ("2T", 2 << 40),
        ("1P", 1 << 50),
        ("0", 0),
    ],
)
def test_the_forms_a_size_takes(text, count):
    assert parse_size(text) == count


@pytest.mark.parametrize(
    "text,why",
    [
        ("8GB", "decimal and lower-case units"),
        ("8g", "decimal and lower-case units"),
        ("512kB", "decimal and lower-case units"),
        ("8 GiB", "is not a byte count"),
        ("8Gi", "is not a byte count"),
        ("-8G", "is not a byte count"),
        ("1e9", "is not a byte count"),
        ("0x10", "is not a byte count"),
        ("1.0000000001K", "is not a byte count"),  # more than 9 decimals
        ("1.1K", "is not a whole number of bytes"),
        ("", "is not a byte count"),
        ("8G\n", "is not a byte count"),
        ("٨G", "is not a byte count"),  # an Arabic-Indic digit: int() would take it
        (True, "(bool) is not a byte count"),
        (8.0, "(float) is not a byte count"),
    ],
)
def test_what_is_not_a_size(text, why):
    with pytest.raises(SizeError, match=why.replace("(", r"\(").replace(")", r"\)")):
        parse_size(text)


def check(overrides: dict) -> dict:
    return validate(
        HostData("spark-01", ["spark"], [Layer("--data", overrides), Layer("group_data", SPARK)]),
        "serve_bf16",
    )


@pytest.mark.parametrize("value", ["8G", "8GiB", 8 * GiB, "8589934592"])
def test_data_takes_every_form_and_reads_it_as_bytes(value):
    data = check({"kv_cache_memory_bytes": value, "min_free_disk_bytes": "20GiB"})
    assert data["kv_cache_memory_bytes"] == 8 * GiB
    assert data["min_free_disk_bytes"] == 20 * GiB


@pytest.mark.parametrize(
    "value,words",
    [("8GB", "'8GB' (str)"), ("2P", "from 1 to 1 PiB"), ("0", "from 1 to 1 PiB")],
)
def test_data_refuses_what_is_not_a_size_in_range(value, words):
    with pytest.raises(DataError) as err:
        check({"kv_cache_memory_bytes": value})
    assert "key 'kv_cache_memory_bytes'" in str(err.value) and words in str(err.value)
    assert "8G = 8GiB" in str(err.value)  # the message shows the forms


def test_one_release_whichever_form_wrote_the_pool():
    assert serving_digest({**SPARK, "kv_cache_memory_bytes": "8GiB"}) == serving_digest(
        {**SPARK, "kv_cache_memory_bytes": 8 * GiB}
    )
    assert serving_digest({**SPARK, "kv_cache_memory_bytes": "4G"}) != serving_digest(
        {**SPARK, "kv_cache_memory_bytes": 8 * GiB}
    )


def test_a_pyinfra_host_reads_bytes_whatever_layer_wrote_a_size():
    """--data (override) over the host's own data over a group's: settle() makes pyinfra's
    host.data read bytes, the value of the layer that wins."""
    inventory = Inventory(
        ([("spark-01", {"kv_cache_memory_bytes": "4G", "min_free_disk_bytes": "1GiB"})], {}),
        override_data={"kv_cache_memory_bytes": "8GiB"},
        spark=(["spark-01"], {"llamacpp_context_bytes": "512M"}),
    )
    host = inventory.get_host("spark-01")
    settle(host.data)
    assert host.data.kv_cache_memory_bytes == 8 * GiB
    assert host.data.min_free_disk_bytes == GiB
    assert host.data.llamacpp_context_bytes == 512 * MiB
    assert host.data.dict()["kv_cache_memory_bytes"] == 8 * GiB


@pytest.mark.parametrize("value", ["8G", "8GiB", "8589934592"])
def test_plan_kv_takes_the_same_forms(capsys, value, tmp_path):
    rc = cli.main(
        ["plan-kv", "--config", "/nonexistent", "--max-model-len", "1024"]
        + ["--kv-cache-memory-bytes", value]
    )
    err = capsys.readouterr().err
    assert rc == 2 and "kv-cache-memory-bytes" not in err, err  # the config is what is missing


def test_plan_kv_refuses_a_decimal_unit(capsys):
    rc = cli.main(["plan-kv", "--max-model-len", "1024", "--kv-cache-memory-bytes", "8GB"])
    assert rc == 2
    assert "decimal and lower-case units" in capsys.readouterr().err
