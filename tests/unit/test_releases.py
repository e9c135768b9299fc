"""Release records as an operator reads them in `servefleet status --wide`."""

import dataclasses

from servefleet.core.releases import Release, what_differs

UNIT = "[Service]\nExecStart=/opt/x/llama-server \\\n  --threads 1 \\\n  --port 8080\n"
A = Release("llama.cpp", "b9785", "/p", "u.service", UNIT, "org/m", "main", "s" * 40, "/m", "d")


def test_a_release_that_differs_only_in_its_unit_or_data_says_how():
    """ "rolled back from llama.cpp b9785" beside llama.cpp b9785 told nothing."""
    slow = UNIT.replace("--threads 1 \\\n", "--threads 1 \\\n  --ubatch-size 1 \\\n")
    assert what_differs(A, dataclasses.replace(A, unit_text=slow)) == (
        "llama.cpp b9785: unit +--ubatch-size 1"
    )
    assert what_differs(A, dataclasses.replace(A, data_digest="e")) == "llama.cpp b9785: other data"
    assert what_differs(A, dataclasses.replace(A, commit="86b7cd4c91")).startswith(
        "llama.cpp b9785: commit 86b7cd4c9"
    )


def test_releases_with_other_names_need_no_more():
    assert what_differs(A, dataclasses.replace(A, version="b9786")) == "llama.cpp b9786"
