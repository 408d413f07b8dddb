"""ettools: convert, synthesize, rewrite, validate and replay execution traces of distributed AI jobs."""

__version__ = "0.1.0"
