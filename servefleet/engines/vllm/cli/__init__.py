"""vLLM's own `servefleet` sub-commands (Engine.commands)."""
