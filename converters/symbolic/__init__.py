"""Symbolic synthesis of execution traces (``ettools synth``): templates → distributed per-rank graphs.

Pipeline: a template (:mod:`.templates`, the text format; built-ins in ``templates/``) gives a
:class:`~.ir.Model` of modules over symbolic tensors; :mod:`.autodiff` derives each module's
backward; :mod:`.distribute` splits every op for a :class:`~.distribute.Plan` and inserts the
collectives (:mod:`ettools.redistribute`, the matcher shared with the rewriter); :mod:`.instantiate`
substitutes numbers and assembles one graph per pipeline stage with numpy, from which ranks are
stamped; :mod:`.synth` is the entry point (:func:`synthesize`, :func:`write_synth`,
:func:`synth_summary`). :mod:`.presets` names published models.
"""

from .presets import PRESETS, get_preset, preset_names
from .synth import SynthResult, synth_summary, synthesize

__all__ = ["PRESETS", "SynthResult", "get_preset", "preset_names", "synth_summary", "synthesize"]
