"""Compatibility name: the bulk Chakra node decoder lives in :mod:`ettools.converters.chakra.decode`."""

from __future__ import annotations

from ettools.converters.chakra.decode import CHUNK, collect_wire, words

__all__ = ["CHUNK", "collect_wire", "words"]
