"""Model lints: pure functions that read headers and indexes, never tensor data.

- `checkpoint`: safetensors checkpoint directory versus its config.json.
- `gguf_lint`: GGUF block_count versus blk.N tensors. Standalone (gguf + stdlib only): deploys
  upload `GGUF_LINT_SCRIPT` to a node and run it there with the tools venv's python.
"""

from pathlib import Path

from servefleet.lint import gguf_lint
from servefleet.lint.checkpoint import CheckpointLint, Finding, check_recipe, lint_checkpoint
from servefleet.lint.gguf_lint import GgufLint, lint_gguf, override_kv_flag

# The file a deploy uploads to a node: `python gguf_lint.py FILE` prints the lint as JSON.
GGUF_LINT_SCRIPT = Path(gguf_lint.__file__)

__all__ = [
    "GGUF_LINT_SCRIPT", "CheckpointLint", "Finding", "GgufLint",
    "check_recipe", "lint_checkpoint", "lint_gguf", "override_kv_flag",
]
