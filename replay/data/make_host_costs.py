"""Re-measure the host-cost table (``host_costs.json``) that emulated capture charges host time
with: ``python -m ettools.replay.data.make_host_costs``.

The sources are this project's own Hugging Face forwards profiled on a lent H200 machine
(``sample_traces/hf_h200``, ``record_shapes`` + ``with_stack``); the method is
:func:`ettools.converters.emulate.host_fit.fit_host_costs`. The ``hardware_pairs`` traces of
``../shared`` are not sources: emulated capture is checked against them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ettools.converters.emulate.host_fit import fit_host_costs

SOURCES = "sample_traces/hf_h200"


def main(argv: list[str] | None = None) -> int:
    """Measure and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[2])
    args = ap.parse_args(argv)
    files = sorted((args.repo / SOURCES).glob("*.json.gz"))
    if not files:
        print(f"no traces under {args.repo / SOURCES}")
        return 1
    table = fit_host_costs(files, labels=[str(f.relative_to(args.repo)) for f in files])
    out = Path(__file__).with_name("host_costs.json")
    out.write_text(json.dumps(table, indent=1) + "\n")
    print(json.dumps({k: v for k, v in table.items() if k != "per_trace"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
