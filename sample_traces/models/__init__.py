"""Sample models: a small GPT-style decoder and explicit parallel variants of it."""
