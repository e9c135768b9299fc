"""servefleet: provision LLM serving nodes with pyinfra."""

__version__ = "0.1.0"
