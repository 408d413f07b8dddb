"""Regenerate the shipped network fits ``replay/data/network/<preset>.json`` from Vidur's measured
NCCL tables (``shared/data/vidur_profiling/network/<gpu>_dgx``: all-reduce and send/recv on DGX
A100/H100). Run: python replay/data/make_network_fits.py [VIDUR_NETWORK_DIR]"""

from __future__ import annotations

import sys
from pathlib import Path

from ettools.replay.netfit import fit_nccl_tables, read_nccl_tables

HERE = Path(__file__).resolve().parent
DEFAULT = HERE.parents[1].parent / "shared" / "data" / "vidur_profiling" / "network"
TABLES = {"A100": "a100_dgx", "H100": "h100_dgx"}


def main(root: Path = DEFAULT) -> None:
    """Fit and write one file per preset."""
    for preset, sub in TABLES.items():
        tab = read_nccl_tables(root / sub)
        fit = fit_nccl_tables(tab, source=f"vidur_profiling/network/{sub} (all_reduce.csv, send_recv.csv; "
                                          "microsoft/vidur, MIT)")
        out = fit.save(HERE / "network" / f"{preset}.json")
        print(out, len(fit.curves), "curves")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
