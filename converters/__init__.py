"""Readers and writers of trace formats, and the symbolic synthesizer: each converts to or from the graph model."""
