"""Which op models time a GPU: the shipped fits (read once) and other GPUs' fits moved to it.

The shipped fits are ``data/op_models/*.json`` (:class:`.opmodel.OpModel`, fitted on real kernels
by ``python -m ettools.replay.data.make_op_models``); :func:`op_models_for` picks a hardware
description's own fit and, for the classes it lacks or fitted on too few sizes, the nearest GPU's
fit moved by :meth:`.opmodel.OpModel.transfer_to` (cached per hardware and donor choice).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .devices import Hardware, presets
from .opclass import DECODE_KEY, MIN_CLASS_SAMPLES
from .opmodel import OpModel

# moved fits per (donor choice, hardware): a transfer refits nothing but is not free, and a search
# or serving run asks for the same hardware thousands of times
_OP_MODELS: dict[str, Any] = {}


def op_models_for(hw: Hardware) -> tuple[Any, Any]:
    """``(own, transferred)`` op models (:class:`.opmodel.OpModel`) for a hardware description:
    the shipped fit of its preset (None when there is none), and the classes it lacks — or fitted
    on fewer than :data:`.opclass.MIN_CLASS_SAMPLES` distinct sizes — from other GPUs' fits moved
    to this hardware by :meth:`~.opmodel.OpModel.transfer_to`. Each such class comes from the
    nearest GPU (same vendor first, then the closest bf16 peak) that has it, fitted on enough sizes
    where it replaces an own class: a few sizes fix a class's rate only over the sizes they span
    (H100's attention, fitted on three short-sequence shapes, put an 8k-token causal attention at
    a third of the rate A100's 4,191-size fit moved to H100 gives), and its ratio to another GPU's
    class is not used to move that class either. A description whose peak or bandwidth was changed
    from its preset's is not that preset: only a transfer applies."""
    key = hw.preset
    table = presets()
    fits = shipped_op_models()
    base = table.get(key, {})
    same = bool(base) and base.get("peak_tflops") == hw.peak_tflops and \
        float(base.get("hbm_gbps", 0)) == float(hw.hbm_gbps) and not hw.preset_label
    own = fits.get(key) if same else None
    sms = hw.sms or (own.sms if own else 0)
    vendor = hw.match.get("vendor")
    others = [k for k in fits if k != key or not same]
    if not others:
        return own, None
    bf = float(hw.peak_tflops.get("bf16", 0) or 0)

    def dist(k: str) -> tuple[int, float, str]:
        v = table.get(k, {})
        return (0 if (v.get("match") or {}).get("vendor") == vendor else 1,
                abs(np.log(max(float(v.get("peak_tflops", {}).get("bf16", 1)), 1) / max(bf, 1))), k)

    def family(classes: dict[str, Any], name: str) -> dict[str, Any]:
        return {k: c for k, c in classes.items() if k.removesuffix("_shaped") == name}

    def well_sampled(classes: dict[str, Any], name: str) -> bool:
        fam = family(classes, name)
        return bool(fam) and all(c.sizes <= 0 or c.sizes >= MIN_CLASS_SAMPLES for c in fam.values())

    donors = sorted(others, key=dist)
    names = sorted({k.removesuffix("_shaped") for d in donors for k in fits[d].classes})
    weak = {n for n in names if own is not None and family(own.classes, n) and not well_sampled(own.classes, n)}
    # per class: the nearest donor that fitted it on enough sizes (else, for a class this GPU lacks,
    # the nearest that has it): a GPU without a fit of its own (H200) then takes the same fit of the
    # class as the GPU it is compared with (H100), so a term-wise transfer between them is one fit's
    source: dict[str, str] = {}
    for n in names:
        if own is not None and family(own.classes, n) and n not in weak:
            continue
        if own is not None and n == DECODE_KEY:
            # a GPU's own fit times decode attention with its memory class where it has no decode
            # kernels of its own or of its vendor (OpModel.borrow_decode): not another vendor's kernels
            continue
        has = [d for d in donors if family(fits[d].classes, n)]
        pick = next((d for d in has if well_sampled(fits[d].classes, n)), None)
        if pick is None and n not in weak and has:
            pick = has[0]  # nobody fitted it on enough sizes: the nearest fit of it
        if pick is not None:
            source[n] = pick
    weak &= set(source)
    kept = own if own is None or not weak else OpModel(
        own.gpu, own.hw, own.sms, {k: c for k, c in own.classes.items() if k.removesuffix("_shaped") not in weak},
        own.sources)
    if not source:
        return kept, None
    ck = (tuple(sorted(source.items())), key, json.dumps(dict(hw.peak_tflops), sort_keys=True), hw.hbm_gbps, sms)
    moved = _OP_MODELS.get(str(ck))
    if moved is None:
        classes: dict[str, Any] = {}
        first = None
        for d in sorted(set(source.values()), key=dist):
            # with this GPU's own (well-sampled) fit, each term moves by the ratio the two fits measured
            m = fits[d].transfer_to(key or hw.label, hw, sms or fits[d].sms, target_fit=kept)
            first = first or m
            classes.update({k: c for k, c in m.classes.items() if source.get(k.removesuffix("_shaped")) == d})
        moved = OpModel(first.gpu, first.hw, first.sms, dict(sorted(classes.items())), first.sources)
        _OP_MODELS[str(ck)] = moved
    return kept, moved


_OP_DIR = Path(__file__).with_name("data") / "op_models"
_SHIPPED: dict[str, Any] | None = None  # read once per process: the files do not change under a run


def shipped_op_models() -> dict[str, Any]:
    """The shipped op models (preset name -> :class:`.opmodel.OpModel`) in ``data/op_models/``."""
    global _SHIPPED
    if _SHIPPED is None:
        _SHIPPED = {}
        for f in sorted(_OP_DIR.glob("*.json")) if _OP_DIR.is_dir() else []:
            m = OpModel.load(f)
            _SHIPPED[m.gpu] = m
    return _SHIPPED
