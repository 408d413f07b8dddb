"""PyTorch ET operator values, as kept in the ``inputs``/``outputs`` IOInfo attributes.

A tensor value is ``[tensor_id, storage_id, offset, numel, itemsize, device]``; lists
(``GenericList[Tensor]``, ``Tensor[][]``) nest them. Readers and rewriters walk these values
with the functions here, so both see the tensors in the same order.
"""

from __future__ import annotations

from typing import Any


def is_tensor(v: Any) -> bool:
    """Whether ``v`` is one ET tensor value."""
    return (type(v) is list and len(v) == 6 and type(v[5]) is str and type(v[0]) is int
            and type(v[3]) is int and type(v[4]) is int)


def walk_tensors(v: Any, s: Any, out: list) -> None:
    """Append ``(tensor value, its shape)`` for every tensor in ``v`` (depth-first) to ``out``.

    ``s`` is the matching (possibly nested) shape; where the nesting does not line up the
    shape is None.
    """
    if is_tensor(v):
        out.append((v, s))
        return
    if type(v) is list:
        ss = s if type(s) is list and len(s) == len(v) else [None] * len(v)
        for x, y in zip(v, ss):
            if type(x) is list:
                walk_tensors(x, y, out)
