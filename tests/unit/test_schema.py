"""The recipe data schema: every shipped group_data file is valid; bad values are named."""

from pathlib import Path

import pytest

from servefleet import schema
from servefleet.groupdata import load as group_data

ROOT = Path(__file__).resolve().parents[2]


class FakeHost:
    def __init__(self, name, data):
        self.name = name
        self.data = data




@pytest.mark.parametrize("groups", [("all", "spark"), ("all", "rtx4090"), ("all", "depot"),
                                    ("all", "spark", "testbed"), ("all", "rtx4090", "testbed")])
def test_shipped_group_data_is_valid(groups):
    schema.validate(FakeHost("h", group_data(*groups)), schema.BASE)


@pytest.mark.parametrize("key,value,expected", [
    ("service_port", "abc", "an integer from 1 to 65535"),
    ("service_port", 70000, "an integer from 1 to 65535"),
    ("service_state", "paused", "one of 'running', 'stopped'"),
    ("servefleet_root", "opt/sf", "an absolute path"),
    ("hf_endpoint", "huggingface.co", "an http(s) URL"),
    ("require_gpu", "yes", "true or false"),
    ("service_host", "localhost", "an IP address"),
])
def test_malformed_value_names_host_key_value_and_form(key, value, expected):
    data = group_data("all", "spark")
    data[key] = value
    with pytest.raises(schema.DataError) as err:
        schema.validate(FakeHost("spark-01", data), schema.BASE)
    msg = str(err.value)
    assert "spark-01" in msg and repr(key) in msg and repr(value) in msg and expected in msg


def test_missing_key_is_named():
    data = group_data("all", "spark")
    del data["hf_endpoint"]
    with pytest.raises(schema.DataError, match="'hf_endpoint' is missing"):
        schema.validate(FakeHost("spark-01", data), schema.BASE)


def test_depot_source_needs_a_depot_host():
    data = group_data("all", "spark") | {"model_source": "depot"}
    with pytest.raises(schema.DataError, match="depot_host"):
        schema.validate(FakeHost("spark-01", data), schema.BASE)


def test_every_base_key_is_documented_where_defined():
    text = (ROOT / "group_data/all.py").read_text()
    for key in schema.BASE:
        line = next((l for l in text.splitlines() if l.startswith(f"{key} =")), None)
        assert line is not None, f"{key} has no default in group_data/all.py"
        assert "#" in line, f"{key} has no comment in group_data/all.py"
