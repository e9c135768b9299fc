"""Model lints: pure functions that read headers and indexes, never tensor data.

- `checkpoint`: a safetensors checkpoint directory versus its config.json.
- `gguf_lint`: GGUF block_count versus blk.N tensors. Standalone (gguf + stdlib only): the
  llama.cpp recipe uploads this very file to a node and runs it there as the service user.
"""
