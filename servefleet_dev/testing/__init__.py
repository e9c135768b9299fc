"""Builders of test material (tiny models, real third-party artifacts) shared by tests and benchmarks."""

from servefleet_dev.testing.llama_build import llama_host_build

__all__ = ["llama_host_build"]
