"""servefleet's test tooling: the testbed, the local hub, the vLLM engine stand-in and the
builders of test material. Installed with the project (its `test` extra brings what the tests
drive); the product package (servefleet) never imports it."""
