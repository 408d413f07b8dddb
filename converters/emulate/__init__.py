"""Emulated capture: run an unmodified PyTorch program as if it ran on GPUs, on a machine without.

How it works (``ettools capture --emulate GPU``):

* :mod:`.native` makes ``cuda`` a device a CPU-only PyTorch accepts (a device guard and CUDA hooks
  that need no driver), loaded before ``import torch``;
* :mod:`.device` answers ``torch.cuda`` as the named GPU would (properties, memory, streams,
  events) and runs the program under PyTorch's ``FakeTensorMode``: every tensor keeps its shape,
  dtype, stride and device but has no storage, so a 70B model fits in a few hundred MB;
* :mod:`.recorder` sits above the fake mode as a dispatch mode and records every aten op the
  program dispatches (operands, stream, module path, autograd phase, allocations and frees, the
  program's own host time between ops) — instead of executing it;
* :mod:`.dist` replaces the process group with PyTorch's fake one: collectives and send/recv move
  no data and are recorded with their group, peers, dtype and bytes;
* :mod:`.kineto_out` writes the record as a Kineto trace (``rank<N>.kineto.json.gz``), read back
  by the ordinary reader, with device-op durations from the compute model of the emulated GPU.
"""
