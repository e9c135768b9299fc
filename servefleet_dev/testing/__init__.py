"""Builders of test material (tiny models, real third-party artifacts) shared by tests and benchmarks.

Modules are imported by name (e.g. servefleet_dev.testing.llama_build): some run on machines
without servefleet's dependencies (the lent GPU's python has no pyinfra), so this package
imports nothing on its own.
"""
