"""Symbolic synthesis of execution traces (``ettools synth``): templates → distributed per-rank graphs.

Pipeline: a template (:mod:`.templates`, the text format; built-ins in ``templates/``) gives a
:class:`~.ir.Model` of modules over symbolic tensors; :mod:`.autodiff` derives each module's
backward; :mod:`.distribute` splits every op for a :class:`~.distribute.Plan` and inserts the
collectives (:mod:`ettools.redistribute`, the matcher shared with the rewriter); :mod:`.instantiate`
substitutes numbers and assembles one graph per pipeline stage with numpy, from which ranks are
stamped; :mod:`.synth` is the entry point (:func:`synthesize`, :func:`synth_summary`) and
:mod:`.write` writes Chakra files (:func:`write_synth`, byte-level stamping of ranks).
:mod:`.presets` names published models.

What is modelled, and what is not:

* counts and bytes: one node per kernel-level op (fused attention forward and backward, one
  matmul per projection and gradient, elementwise ops, collectives), comm sizes in bytes with
  Chakra's ``comm_size`` meaning; durations from a roofline over FLOPs and bytes (H100 numbers
  by default) — ASTRA-sim can use its own roofline from ``num_ops``/``tensor_size``;
* templates ``gpt_stage`` + preset ``gpt3-5b-stage`` model GPT the way STAGE does and reproduce
  its Table VI counts exactly; ``sample_gpt``/``sample_moe`` reproduce the project's sample
  captures (matmuls, collectives and bytes per rank);
* peak memory per rank is analytic (resident weights/gradients/optimizer states under the ZeRO
  stage + activations kept between each forward and its backward along the schedule + the
  largest op's working set); the graphs carry no tensor tables;
* not modelled: FSDP prefetch and communication/computation stream overlap beyond what data
  dependencies allow, ring attention (CP all-gathers K/V, Llama-3 style), key/value heads
  replicated when tp exceeds their number, sequence-state exchange of SSM scans under cp.
"""

from .presets import PRESETS, get_preset, preset_names
from .synth import SynthResult, synth_summary, synthesize
from .write import write_synth

__all__ = ["PRESETS", "SynthResult", "get_preset", "preset_names", "synth_summary", "synthesize", "write_synth"]
