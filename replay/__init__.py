"""Event-driven replay of a multi-rank graph on a described cluster."""
