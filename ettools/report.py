"""``ettools info``: gather a trace's summary, linking and cross-rank matching, and render it."""

from __future__ import annotations

from typing import Any

from ettools.formats import Loaded
from ettools.summary import COMM_KEYS, human_bytes, summarize
from ettools.text_table import simple_table  # tabulate's bytes without its import (~45 ms)


def info_report(loaded: Loaded) -> dict[str, Any]:
    """Everything ``ettools info --json`` prints (see README for the shape)."""
    from ettools.collate import match_collectives, match_p2p

    trace = loaded.trace
    report = summarize(trace)
    report["format"] = loaded.format
    report["files"] = [str(p) for p in loaded.files]
    report["linking"] = loaded.link_report.to_dict() if loaded.link_report is not None else None
    report["collectives"] = match_collectives(trace).to_dict()
    report["p2p"] = match_p2p(trace).to_dict()
    report["problems"] = trace_problems(loaded)
    return report


def trace_problems(loaded: Loaded) -> dict[str, int]:
    """Counts of defects the readers kept (the trace is usable, but say so): dependency cycles,
    negative durations clamped to 0 (per-rank ``negative_durations``)."""
    out = dict(loaded.problems)
    neg = sum(int(g.meta.get("negative_durations", 0) or 0) for g in loaded.trace.graphs.values()
              if isinstance(getattr(g, "meta", None), dict))
    if neg:
        out["negative_durations_clamped"] = neg
    return out


def render_info(report: dict[str, Any]) -> str:
    """A human-readable rendering of :func:`info_report`'s dict."""
    lines = [
        f"source: {report['source']}  format: {report['format']}",
        *([f"times: modelled by an emulated capture for {report.get('emulated_gpu', '?')} (nothing measured)"]
          if report.get("durations") == "modelled" else
          ["times: rewritten from another plan's measurements (this plan was not measured)"]
          if report.get("durations") == "rewritten" else []),
        f"world size: {report['world_size']}  ranks present: {report['ranks_present']}",
    ]
    groups = report["process_groups"]
    if groups:
        shown = ", ".join(f"{k}: {_ranks_text(v)}" for k, v in list(groups.items())[:8])
        more = f" (+{len(groups) - 8} more)" if len(groups) > 8 else ""
        lines.append(f"process groups: {shown}{more}")
    rows = []
    for rank, r in report["ranks"].items():
        bt = r["by_type"]
        rows.append([
            rank, r["nodes"], bt.get("COMP_NODE", 0), bt.get("COMM_COLL_NODE", 0),
            bt.get("COMM_SEND_NODE", 0), bt.get("COMM_RECV_NODE", 0),
            sum(v for k, v in bt.items() if k not in
                ("COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE")),
            r["edges"], f"{r['span_us'] / 1000:.3f}" if "span_us" in r else "-",
        ])
    lines += ["", simple_table(rows, headers=["rank", "nodes", "COMP", "COLL", "SEND", "RECV", "other",
                                              "edges", "span ms"])]
    comm_rows = []
    for rank, r in report["ranks"].items():
        for key in COMM_KEYS + ["UNKNOWN"]:
            c = r["comm"].get(key)
            if c and c["count"]:
                comm_rows.append([rank, key, c["count"], c["bytes"], human_bytes(c["bytes"])])
    if comm_rows:
        lines += ["", simple_table(comm_rows, headers=["rank", "communication", "count", "bytes", ""])]
    problems = []
    for rank, r in report["ranks"].items():
        if r["dangling_deps"]:
            problems.append(f"rank {rank}: {r['dangling_deps']:,} dependencies name missing nodes")
        if r.get("comm_unknown_size"):
            problems.append(f"rank {rank}: {r['comm_unknown_size']:,} collectives with unknown size")
        for attr, count in r["comm_missing_attrs"].items():
            if attr != "comm_size" or not r.get("comm_unknown_size"):
                problems.append(f"rank {rank}: {count:,} comm nodes lack {attr}")
    link = report.get("linking")
    if link:
        lines += ["", f"linking ({link.get('method')}): host ops {link.get('host_ops_matched', 0):,}/"
                      f"{link.get('et_host_ops', 0):,} matched, device ops "
                      f"{link.get('device_ops_attached', 0):,}/{link.get('device_ops_in_window', 0):,} "
                      f"attached: linking rate {100 * float(link.get('linking_rate', 0)):.1f} %"]
        lines += [f"  warning: {w}" for w in link.get("warnings", [])]
    coll, p2p = report["collectives"], report["p2p"]
    lines += [
        "",
        f"collectives: {coll['collectives']:,} nodes in {coll['groups']} group(s): "
        f"{coll['matched']:,} matched on every member, {coll['unmatched_count']:,} unmatched, "
        f"{coll['unverifiable']:,} unverifiable (members not in the trace)",
        f"send/recv: {p2p['comm_nodes']:,} nodes: {p2p['matched']:,} pairs matched, "
        f"{p2p['unmatched_count']:,} unmatched, {p2p['unverifiable']:,} unverifiable",
    ]
    for name, count in (report.get("problems") or {}).items():  # defects the readers kept
        problems.append(f"{count:,} {name.replace('_', ' ')}")
    for item in (coll.get("unmatched") or [])[:10] + (p2p.get("unmatched") or [])[:10]:
        problems.append("unmatched: " + ", ".join(f"{k}={v}" for k, v in item.items()))
    if problems:
        lines += ["", "problems:"] + [f"  {p}" for p in problems]
    return "\n".join(lines)


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) > 6:
        return f"[{ranks[0]}, {ranks[1]}, …, {ranks[-1]}] ({len(ranks)})"
    return str(ranks)
