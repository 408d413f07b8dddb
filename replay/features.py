"""FLOPs and bytes of each node of a rank graph, and which nodes a compute model may time.

FLOPs and bytes of a node (:func:`node_features`) are its ``num_ops``/``tensor_size`` columns when
present; otherwise, for graphs carrying PyTorch ET tensors, they are derived from the shapes of the
op (or, for a kernel, of the host op that launched it): ``aten::mm``/``addmm``/``bmm``/``baddbmm``/
``matmul``/``linear`` 2·M·N·K; convolutions ``2 · numel(output) · numel(weight) / out_channels``
(their backward twice that); anything else one FLOP per output element. Bytes are the distinct
input and output tensors' bytes.
"""

from __future__ import annotations

import numpy as np

from ettools.graph import COMM_NODE_TYPES, EdgeKind, NodeType, RankGraph

_MM = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
       "aten::addbmm", "aten::einsum")
_CONV = ("aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv2d",
         "aten::conv1d", "aten::conv3d", "aten::mkldnn_convolution", "aten::miopen_convolution")
_CONV_BWD = ("aten::convolution_backward", "aten::cudnn_convolution_backward",
             "aten::miopen_convolution_backward")
# ops that only make a new view or allocate (no kernel runs, no data moves): 0 FLOPs and 0 bytes
_NO_KERNEL = ("aten::view", "aten::_unsafe_view", "aten::reshape", "aten::as_strided", "aten::t",
              "aten::transpose", "aten::permute", "aten::expand", "aten::expand_as", "aten::slice",
              "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::detach", "aten::detach_",
              "aten::alias", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::resize_",
              "aten::set_", "aten::unbind", "aten::split", "aten::split_with_sizes", "aten::chunk",
              "aten::narrow", "aten::diagonal", "aten::lift_fresh", "aten::numpy_T", "aten::flatten",
              "aten::unflatten", "aten::view_as", "aten::_reshape_alias", "aten::is_nonzero",
              "aten::size", "aten::stride", "aten::item", "aten::_local_scalar_dense", "aten::contiguous",
              "aten::new_empty", "aten::new_empty_strided", "aten::to", "aten::_to_copy_meta")


def _shape_flops(name: str, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> float:
    """FLOPs of one op from its name and tensor shapes (see the module docstring)."""
    def numel(s: tuple[int, ...]) -> int:
        n = 1
        for x in s:
            n *= max(int(x), 0)
        return n

    mats = [s for s in ins if len(s) >= 2]
    out = outs[0] if outs else ()
    if name in _MM and len(mats) >= 2:
        a, b = mats[-2], mats[-1]
        if name == "aten::linear":  # x [..., K], W [N, K]
            x, w = mats[0], mats[1]
            return 2.0 * numel(x) * w[0]
        k = a[-1]
        return 2.0 * (numel(out) if out else numel(a) // max(k, 1) * b[-1]) * k
    if name in _CONV and len(mats) >= 2 and out:
        w = mats[1]
        return 2.0 * numel(out) * numel(w) / max(w[0], 1)
    if name in _CONV_BWD and len(mats) >= 3:
        gout, w = mats[0], mats[2]
        return 4.0 * numel(gout) * numel(w) / max(w[0], 1)
    if out:
        return float(numel(out))
    return float(max((numel(s) for s in ins), default=0))


def node_features(g: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """``(flops, bytes)`` per node (-1 unknown): columns first, then ET tensor shapes (see module doc).

    Device ops without their own figures take their launching host op's.
    """
    flops = g.num_ops.astype(np.float64)
    nbytes = g.tensor_size.astype(np.float64)
    flops[g.num_ops < 0] = -1.0
    nbytes[g.tensor_size < 0] = -1.0
    t = g.tensors
    has_io = len(t) and (len(g.in_tensor) or len(g.out_tensor))
    if has_io:
        tb = (np.maximum(t.numel, 0) * np.maximum(t.elem_bytes, 0)).astype(np.float64)
        in_cnt, out_cnt = np.diff(g.in_ptr), np.diff(g.out_ptr)
        rows = np.flatnonzero(((in_cnt > 0) | (out_cnt > 0)) & ((flops < 0) | (nbytes < 0)))
        names = g.strings
        name_col = g.name
        for r in rows.tolist():
            ins = g.in_tensor[g.in_ptr[r]:g.in_ptr[r + 1]]
            outs = g.out_tensor[g.out_ptr[r]:g.out_ptr[r + 1]]
            if nbytes[r] < 0:
                nbytes[r] = float(tb[np.unique(np.concatenate((ins, outs)))].sum())
            if flops[r] < 0:
                nm = names[int(name_col[r])]
                flops[r] = _shape_flops(nm, [t.shape(int(i)) for i in ins], [t.shape(int(o)) for o in outs])
    if has_io and len(rows):
        # view/allocation ops run no kernel (when they copy, a nested aten::copy_ does the work)
        ids = [i for i in (g.strings.lookup(x) for x in _NO_KERNEL) if i >= 0]
        if ids:
            nk = rows[np.isin(name_col[rows], ids)]
            flops[nk] = 0.0
            nbytes[nk] = 0.0
    # device ops inherit from their launcher
    src, dst, kind = g.edge_rows()
    sel = (kind == EdgeKind.LAUNCH) & (src >= 0)
    if sel.any():
        s, d = src[sel], dst[sel]
        dev = g.is_cpu_op[d] != 1
        s, d = s[dev], d[dev]
        fl = flops[d] < 0
        flops[d[fl]] = flops[s[fl]]
        by = nbytes[d] < 0
        nbytes[d[by]] = nbytes[s[by]]
    return flops, nbytes


def is_model_target(g: RankGraph) -> np.ndarray:
    """Nodes whose time a compute model may replace: device (or unplaced) compute nodes, and host
    compute nodes without a measured duration (a PyTorch ET alone: its operators' time is the
    device work they launch)."""
    comm = np.isin(g.type, [int(x) for x in COMM_NODE_TYPES])
    unmeasured_host = (g.is_cpu_op == 1) & ~(np.isfinite(g.dur) & (g.dur >= 0))
    out = ((g.is_cpu_op != 1) | unmeasured_host) & ~comm & (g.type != NodeType.METADATA_NODE)
    hold = g.strings.lookup("device_hold")  # a measured wait of the device, not an operator
    if hold >= 0:
        out &= g.name != hold
    return out

