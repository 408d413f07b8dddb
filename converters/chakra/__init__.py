"""Chakra execution traces (``.et``, schema 0.0.4): streaming reader and vectorized writer.

A Chakra trace is one file per rank, ``<prefix>.<rank>.et``: a stream of varint-length-prefixed
protobuf messages, a ``GlobalMetadata`` first and then one ``Node`` per frame (see
``../shared/notes/chakra-format.md``), plain or gzipped, plus a ``comm_group.json`` naming the
members of each communicator.

Mapping between a Chakra ``Node`` and a row of :class:`~ettools.graph.RankGraph` (one mapping,
used by both this package and :mod:`ettools.converters.chakra_json`):

* ``id``, ``name``, ``type``, ``start_time_micros`` → ``start`` (NaN for every node when all are
  0: the file has no start times), ``duration_micros`` → ``dur``;
  ``data_deps`` → :attr:`EdgeKind.DATA` edges, ``ctrl_deps`` → :attr:`EdgeKind.CTRL` edges (each
  list keeps its order; the writer writes every non-DATA kind as ``ctrl_deps``).
* Attributes with a column: ``is_cpu_op``, ``num_ops``, ``tensor_size``, ``comm_type``,
  ``comm_size`` → ``comm_bytes``, ``pg_name`` → ``comm_group``, ``comm_tag``, ``resource`` (an
  ettools extension, ``string_val``), and ``comm_src``/``comm_dst`` → ``comm_peer`` (the side that
  is not the file's own rank, on SEND/RECV nodes). A value a column cannot hold (wrong field
  kind, out of range, a second copy on the same node, src/dst not naming the own rank) stays a
  sparse attribute instead, so nothing is lost. A field kind other than the one ASTRA-sim reads
  is remembered per rank in ``RankGraph.meta["chakra_attr_kinds"]`` and reused by the faithful
  writer.
* Every other attribute → a sparse :class:`~ettools.graph.AttrColumn` of the same name whose
  ``kind`` is its value field (``"int64_val"``, ``"bool_list"`` with a list value, …; ``"none"``
  for an attribute with no value). Should one name come with several kinds in a rank, the first
  kind keeps the plain name and the others are stored as ``"<name>@<kind>"`` (the writer strips
  the suffix). ``AttributeProto.doc_string`` is not kept.
* ``inputs``/``outputs`` (``IOInfo``) → attribute columns ``"inputs"``/``"outputs"`` of kind
  ``"io"`` holding ``(values, shapes, types)``, only when not all empty.
* ``GlobalMetadata`` → ``RankGraph.meta["chakra_metadata"] = {"version": str, "attr":
  [(name, kind, value), ...]}``, written back as read. Reader notes (a zero-length frame ending
  the stream early) go to ``RankGraph.meta["chakra_notes"]``.

The writer has two modes. ``strict=True`` (everything ettools builds) writes what ASTRA-sim
accepts: no METADATA/INVALID nodes (dropped, their dependencies passed on to their dependents),
no dangling, self or duplicate dependencies (dropped and counted), the value kinds of the
table in chakra-format.md, and every COMM_COLL with ``comm_type``, ``comm_size`` and ``pg_name``
(every SEND/RECV with peer, size and tag) or a ``ValueError`` naming the node. Process groups
get decimal keys of one width, ``"1"``, ``"2"``, … (``"10"``, ``"11"``, … from 10 groups on) in
natural order of their names (``"2"`` before ``"10"``, then text) and ``pg_name`` is that key; one
width lets ranks that differ only in their groups be written as one encoding with the keys
patched (see :mod:`.shared`). ``strict=False`` writes a foreign Chakra file's nodes
as read (group names verbatim). Both emit nodes in ascending id order and produce the same
bytes for the same graph. The node bytes are built column-wise by
:mod:`ettools.converters.chakra_wire`, not one protobuf message at a time; they equal what
the protobuf runtime serializes for the same message (tested byte for byte).

The reader splits frames itself and decodes the nodes in bulk with numpy
(:mod:`.decode`); a file with encodings that decoder leaves alone
(unknown fields, a repeated singular field, ...) is decoded one ``pb.Node`` at a time instead,
which gives identical graphs (``RankGraph.meta["chakra_decoder"]`` says which ran). Bad input
raises :class:`~ettools.errors.TraceError` naming the file and the frame number and byte offset.

Modules, each importing only those above it:

* :mod:`.attributes` — attribute value kinds, column attributes, attribute values <-> protobuf;
* :mod:`.paths` — rank files, ``comm_group.json``, rank lists;
* :mod:`.times` — measured times as the file's whole microseconds;
* :mod:`.metadata` — what ettools keeps in ``GlobalMetadata``;
* :mod:`.mapping` — the Node -> RankGraph mapping; :mod:`.decode` — the bulk decoder feeding it;
* :mod:`.reader` — frames, files and sets read (:func:`read_chakra`), the stamped fast path;
* :mod:`.astrasim` — the forms ASTRA-sim runs (host chain, rank release, lowered collectives);
* :mod:`.encodings` — wire bytes of node fields; :mod:`.strict` — what strict mode enforces;
* :mod:`.encoder` — one rank's stream (:func:`encode_rank`); :mod:`.shared` — ranks sharing a
  structure encoded once; :mod:`.writer` — :func:`write_chakra`.

The names of the former single module ``ettools.converters.chakra`` are re-exported here.
"""

from __future__ import annotations

from .astrasim import (
    ASTRASIM_LOWERING,
    ASTRASIM_UNSUPPORTED,
    HOST_CHAIN_META,
    RANK_RELEASE_NAME,
    astrasim_collective_form,
    astrasim_end_form,
    astrasim_host_form,
    astrasim_min_bytes,
    astrasim_release_form,
    astrasim_warnings,
    astrasim_world,
    one_host_chain,
)
from .attributes import (
    BYTES_KINDS,
    COLUMN_ATTR_NAMES,
    FIXED_KINDS,
    INT_COLUMN_ATTRS,
    INT_KINDS,
    IO_ATTRS,
    PEER_ATTRS,
    PEER_KIND,
    STR_COLUMN_ATTRS,
    VALUE_KINDS,
    VARINT_KINDS,
    ZIGZAG_KINDS,
    attr_message,
    attr_value,
    canonical_kind,
    set_attr_value,
    split_attr_key,
)
from .encoder import (
    CHUNK_NODES,
    encode_rank,
)
from .encodings import (
    attr_entries,
)
from .mapping import (
    Collected,
    build_rank_graph,
    collect_messages,
    nodes_to_graph,
)
from .metadata import (
    DEFAULT_VERSION,
    ETTOOLS_META_ATTRS,
    LAUNCH_DEPTH_ATTR,
    LAUNCH_NAMES_ATTR,
    LAUNCH_TYPICAL_META,
    LAUNCH_US_ATTR,
    RANK_CLOCK_ATTR,
    STEP_END_ATTR,
    STEP_NAMES_ATTR,
    STEP_START_ATTR,
    STREAM_GAP_ATTR,
    STREAM_GAP_META,
    SYNTH_META_ATTRS,
    ettools_metadata_attrs,
    metadata_for,
    metadata_message,
    metadata_to_dict,
    restore_launch_edges,
    synth_metadata,
    take_ettools_metadata,
)
from .paths import (
    COMM_GROUP_FILE,
    comm_group_json,
    format_rank_list,
    group_keys,
    missing_ranks,
    natural_key,
    parse_rank_list,
    rank_of,
    read_comm_groups,
    resolve_rank_files,
)
from .reader import (
    frame_bounds,
    iter_frames,
    read_chakra,
    read_chakra_file,
)
from .strict import (
    WriteStats,
)
from .times import (
    diffused_us,
    duration_lanes,
    included_stream_gap,
)
from .writer import (
    write_chakra,
)

__all__ = [
    "ASTRASIM_LOWERING",
    "ASTRASIM_UNSUPPORTED",
    "BYTES_KINDS",
    "CHUNK_NODES",
    "COLUMN_ATTR_NAMES",
    "COMM_GROUP_FILE",
    "Collected",
    "DEFAULT_VERSION",
    "ETTOOLS_META_ATTRS",
    "FIXED_KINDS",
    "HOST_CHAIN_META",
    "INT_COLUMN_ATTRS",
    "INT_KINDS",
    "IO_ATTRS",
    "LAUNCH_DEPTH_ATTR",
    "LAUNCH_NAMES_ATTR",
    "LAUNCH_TYPICAL_META",
    "LAUNCH_US_ATTR",
    "PEER_ATTRS",
    "PEER_KIND",
    "RANK_CLOCK_ATTR",
    "RANK_RELEASE_NAME",
    "STEP_END_ATTR",
    "STEP_NAMES_ATTR",
    "STEP_START_ATTR",
    "STREAM_GAP_ATTR",
    "STREAM_GAP_META",
    "STR_COLUMN_ATTRS",
    "SYNTH_META_ATTRS",
    "VALUE_KINDS",
    "VARINT_KINDS",
    "WriteStats",
    "ZIGZAG_KINDS",
    "astrasim_collective_form",
    "astrasim_end_form",
    "astrasim_host_form",
    "astrasim_min_bytes",
    "astrasim_release_form",
    "astrasim_warnings",
    "astrasim_world",
    "attr_entries",
    "attr_message",
    "attr_value",
    "build_rank_graph",
    "canonical_kind",
    "collect_messages",
    "comm_group_json",
    "diffused_us",
    "duration_lanes",
    "encode_rank",
    "ettools_metadata_attrs",
    "format_rank_list",
    "frame_bounds",
    "group_keys",
    "included_stream_gap",
    "iter_frames",
    "metadata_for",
    "metadata_message",
    "metadata_to_dict",
    "missing_ranks",
    "natural_key",
    "nodes_to_graph",
    "one_host_chain",
    "parse_rank_list",
    "rank_of",
    "read_chakra",
    "read_chakra_file",
    "read_comm_groups",
    "resolve_rank_files",
    "restore_launch_edges",
    "set_attr_value",
    "split_attr_key",
    "synth_metadata",
    "take_ettools_metadata",
    "write_chakra",
]
