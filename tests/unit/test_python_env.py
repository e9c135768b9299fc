"""Package sources from data, as the recipes read them: from pyinfra's HostData (what a deploy
has), which answers .get() but not [] (an air-gapped index once crashed every converge)."""

from pyinfra.api.host import HostData

from servefleet.core.python_env import source_args


def test_an_air_gapped_index_and_wheelhouse_reach_the_installer():
    data = HostData(
        None,
        {
            "pip_index_url": "http://127.0.0.1:8092/simple",
            "pip_extra_index_urls": ["https://mirror.example/simple"],
            "pip_find_links": ["/var/cache/servefleet/wheels"],
        },
    )
    assert source_args(data) == [
        "--index-url",
        "http://127.0.0.1:8092/simple",
        "--extra-index-url",
        "https://mirror.example/simple",
        "--find-links",
        "/var/cache/servefleet/wheels",
    ]


def test_no_sources_in_data_means_the_installer_defaults():
    assert source_args(HostData(None, {})) == []
