"""Graph rewrites (rescale, reshard, re-parallelize): functions from trace to trace.

Every pass takes a :class:`~ettools.graph.Trace` and returns a new one (inputs are never
modified; unchanged arrays are shared), and proves its result structurally sound with
:func:`ettools.checks.verify` (:class:`PassError` names the rank and node otherwise):

==========================  ===========================================================================
:func:`rescale`              batch / sequence / any named dimension: shapes, FLOPs, bytes, comm sizes,
                             durations (measured × cost ratio, or a calibrated fit)
:func:`reshard`              resize a replicated group (DP 8 → 1,024), ranks stamped out with shared arrays
:func:`data_parallel`        DP replicas + bucketed gradient all-reduce (DDP rules, overlapped or not)
:func:`tensor_parallel`      Megatron TP (column/row pairs found by data flow) and sequence parallelism
:func:`pipeline_parallel`    stages of layers, micro-batches, GPipe / 1F1B, send/recv on every cut
:func:`expert_parallel`      MoE experts sharded, all-to-all dispatch/combine, dense grads all-reduced
:func:`scale_trace`          all of the above composed (what ``ettools scale`` runs)
==========================  ===========================================================================

Analysis shared by the passes: :mod:`.model` (units, phases, forward↔backward, parameters),
:mod:`.flow` (unit data flow), :mod:`.dims` (which tensor dimension carries batch / sequence);
collectives come from :func:`ettools.redistribute.redistribute`, the matcher the synthesizer uses.
Writing many ranks fast needs nothing special: :func:`ettools.replayable.replayable_trace` converts
once per distinct graph and :func:`ettools.converters.chakra.write_chakra` encodes once per distinct
graph, so ranks stamped out with shared arrays cost only their I/O.
"""

from ettools.scaler.dp import data_parallel
from ettools.scaler.ep import expert_parallel
from ettools.scaler.model import ScaleError
from ettools.scaler.passes import scale_trace, strip_data_parallel
from ettools.scaler.pp import pipeline_parallel
from ettools.scaler.proof import PassError, prove
from ettools.scaler.rescale import rescale
from ettools.scaler.reshard import reshard
from ettools.scaler.tp import tensor_parallel

__all__ = [
    "PassError",
    "ScaleError",
    "data_parallel",
    "expert_parallel",
    "pipeline_parallel",
    "prove",
    "rescale",
    "reshard",
    "scale_trace",
    "strip_data_parallel",
    "tensor_parallel",
]
