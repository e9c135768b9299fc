"""Sub-commands of the `servefleet` CLI: each module has register(subparsers)."""
