"""vLLM's operations: the qwen3_5.py patch, the preflights before its start, what its health
check adds."""
