"""The vLLM engine stand-in of the testbed: `vllm_standin.py` (one stdlib-only program that the
real servefleet-vllm unit runs in place of `vllm` on GPU-less hosts) and `install` (copies it and
its data, the H200 recordings in tests/fixtures/h200/vllm/, onto a guest's filesystem)."""
