"""The project's own small real captures: models, training scripts, manifest and regeneration.

``python -m sample_traces.regenerate`` re-captures every scenario of
:mod:`sample_traces.scenarios` with ``ettools capture`` and rewrites ``manifest.json``.
"""
