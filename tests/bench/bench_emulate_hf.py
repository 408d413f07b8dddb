"""Emulated capture of Hugging Face models against real GPU traces of the same models:
``python tests/bench/bench_emulate_hf.py [--only NAME ...] [--json FILE]``.

Each model is built from a ``config.json`` written from its model card (``sample_traces/
hf_configs``), run by a plain forward loop (``sample_traces/hf_run.py``) under ``ettools capture
--emulate GPU`` on this machine (no GPU), at the batch and length the real trace shows, and the
emulated step is compared with the real trace's ``ProfilerStep``:

* ``device``: the sum of kernel times inside the step — a prediction (the op models were fitted
  on kernel samples that include the TraceLens pairs' kernels for H100/MI300X; the H200 traces of
  ``sample_traces/hf_h200`` were fitted on by nothing);
* ``step``: the step's wall time, a prediction twice: with the shipped host-cost table (fitted on
  ``sample_traces/hf_h200``: in-sample for the H200 rows, another machine for the others) and with
  ``--host-from`` the *other* models' real traces of the same machine (leave-one-model-out: the
  host measured on other programs, this program's host time predicted). The real steps were
  profiled with Python stack tracing; most are host-bound. The references of ``hardware_pairs``
  ran ``transformers`` 4.49, this machine runs the installed version: their Python differs
  (bert-small: 1,130 Python events per forward there, ~1,600 here), which moves host-bound steps;
* kernel counts by class (GEMM, attention, element-wise incl. norms) real vs emulated.

Each case runs the ``transformers`` class the reference trace ran (its outermost ``nn.Module``:
the TraceLens Qwen trace ran the base ``Qwen2Model``, no LM head; our H200 capture
``Qwen2ForCausalLM``), passed to ``hf_run.py --model-class``.

``--readme`` prints the table of ``converters/README.md`` (block ``<!-- bench:emulate_hf -->``)
between ``<!-- readme:begin -->`` and ``<!-- readme:end -->`` and the fidelity line of
``README.md`` (its block ``<!-- bench:emulate_hf -->``) between ``<!-- readme:begin README.md -->``
and ``<!-- readme:end -->``: ``python tests/bench/run_all.py --update-readme emulate_hf`` puts them
there (about 20 minutes here: two emulated captures per case).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "traces" / "hardware_pairs"
CFG = REPO / "sample_traces" / "hf_configs"
# name, config, batch, length, [(GPU preset, real trace)]
CASES = [
    ("bert_small", "bert_small", 1, 141, [("H100", SHARED / "bert_small/h100.json.gz"),
                                          ("MI300X", SHARED / "bert_small/mi300x.json.gz")]),
    ("falconsai_vit", "falconsai_vit", 4, 224, [("H100", SHARED / "falconsai_vit/h100.json.gz"),
                                                ("MI300X", SHARED / "falconsai_vit/mi300x.json.gz")]),
    ("qwen1.5_0.5b", "qwen1.5_0.5b", 16, 559, [("H100", SHARED / "qwen1.5_0.5b/h100.json.gz"),
                                               ("MI300X", SHARED / "qwen1.5_0.5b/mi300x.json.gz"),
                                               ("H200", REPO / "sample_traces/hf_h200/qwen1.5_0.5b_s559.json.gz")]),
    ("bert_base", "bert_base", 16, 512, [("H200", REPO / "sample_traces/hf_h200/bert_base.json.gz")]),
    ("gpt2", "gpt2", 8, 1024, [("H200", REPO / "sample_traces/hf_h200/gpt2.json.gz")]),
    ("vit_base", "vit_base", 32, 224, [("H200", REPO / "sample_traces/hf_h200/vit_base.json.gz")]),
    ("tinyllama_1.1b", "tinyllama_1.1b", 4, 2048, [("H200", REPO / "sample_traces/hf_h200/tinyllama_1.1b.json.gz")]),
]
CLASSES = ("GeMM", "Attention", "ElementWise")


def step_summary(path: Path) -> dict:
    """The last ProfilerStep of a Kineto file: wall µs, kernel µs, kernels per class."""
    from ettools.classify import classify

    d = orjson.loads(gzip.open(path).read())
    ev = [e for e in d["traceEvents"] if e.get("ph") == "X"]
    st = [e for e in ev if str(e.get("name", "")).startswith("ProfilerStep")][-1]
    b, en = st["ts"], st["ts"] + st["dur"]
    ks = [e for e in ev if e.get("cat") == "kernel" and b <= e["ts"] <= en]
    cls = Counter(classify(e["name"]) for e in ks)
    return {"step_us": st["dur"], "device_us": sum(e["dur"] for e in ks), "kernels": len(ks),
            "classes": {c: cls.get(c, 0) for c in CLASSES}}


def traced_model_class(path: Path) -> str:
    """The ``transformers`` class the real trace ran: its outermost (longest) ``nn.Module`` event (a
    trace of ``Qwen2Model`` ran no LM head, one of ``Qwen2ForCausalLM`` did)."""
    d = orjson.loads(gzip.open(path).read())
    mods = [e for e in d["traceEvents"] if e.get("ph") == "X" and str(e.get("name", "")).startswith("nn.Module: ")]
    return max(mods, key=lambda e: e["dur"])["name"][len("nn.Module: "):].rsplit("_", 1)[0]


def emulate(cfg: str, batch: int, length: int, gpu: str, out: Path, host_from: list[Path] = (),
            model_class: str | None = None) -> Path:
    extra = [a for p in host_from for a in ("--host-from", str(p))]
    cls = ["--model-class", model_class] if model_class else []
    cmd = [sys.executable, "-m", "ettools", "capture", "--emulate", gpu, "--steps", "2", "-q", "-o", str(out), *extra, "--",
           sys.executable, "-m", "sample_traces.hf_run", str(CFG / cfg), "--batch", str(batch), "--length",
           str(length), "--iters", "2", *cls]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"{cfg} on {gpu}: {res.stderr.strip().splitlines()[-1:]}")
    return out / "rank0.kineto.json.gz"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f} %".replace("-", "−")


def _mape(xs: list[float | None]) -> tuple[float, int]:
    v = [abs(x) for x in xs if x is not None]
    return (sum(v) / len(v) if v else float("nan")), len(v)


def readme_blocks(rows: list[dict]) -> list[str]:
    """The README contents of a full run: the converters/README.md table and summary, then the
    README.md fidelity line (module doc)."""
    pairs = [r for r in rows if "hardware_pairs" in r["reference"]]
    dev, n = _mape([r["device_error_pct"] for r in rows])
    loo_pairs, n_pairs = _mape([r["step_error_pct_same_host"] for r in pairs])
    loo_all, n_loo = _mape([r["step_error_pct_same_host"] for r in rows])
    shipped, _ = _mape([r["step_error_pct"] for r in rows])
    out = ["<!-- readme:begin -->",
           "| model | GPU | class run | device ms real | emulated | error | step ms real | host from other models "
           "| error | shipped host table | error | kernels real / emulated (GEMM, attention, element-wise) |",
           "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        re_, em = r["real"], r["emulated"]
        loo = r.get("loo")
        counts = ", ".join(f"{re_['classes'][c]}/{em['classes'][c]}" for c in CLASSES)
        out.append(f"| {r['model']} | {r['gpu']} | `{r['model_class']}` | {re_['device_us'] / 1e3:.2f} | "
                   f"{em['device_us'] / 1e3:.2f} | {_pct(r['device_error_pct'])} | {re_['step_us'] / 1e3:.2f} | "
                   + (f"{loo['step_us'] / 1e3:.2f}" if loo else "–") + f" | {_pct(r['step_error_pct_same_host'])} | "
                   f"{em['step_us'] / 1e3:.2f} | {_pct(r['step_error_pct'])} | {counts} |")
    out += ["", f"All predictions (one run). Device time MAPE **{dev:.1f} %** over {n} (model, GPU) traces; steps "
            f"with the host measured on the same machine's other models MAPE **{loo_pairs:.1f} %** over the "
            f"{n_pairs} hardware-pair traces, {loo_all:.1f} % over all {n_loo}; with the shipped host table "
            f"{shipped:.1f} % over all {n}.", "<!-- readme:end -->",
            "<!-- readme:begin README.md -->",
            f"- **Emulated capture** (prediction, no GPU): device time of {n} real (model, GPU) Hugging Face traces, "
            f"MAPE {dev:.1f} %; steps with the host measured on the same machine's other models, MAPE "
            f"{loo_pairs:.1f} % over the {n_pairs} hardware-pair traces "
            "— [converters/README.md](converters/README.md#emulated-capture-a-gpu-programs-trace-without-the-gpu).",
            "<!-- readme:end -->"]
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the table (and optionally write it as JSON, or the README blocks)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--readme", action="store_true", help="print the README blocks (a full run only)")
    args = ap.parse_args(argv)
    if args.readme and args.only:
        ap.error("--readme needs every case: drop --only")
    rows = []
    print(f"{'model':15s} {'GPU':7s} {'device ms real':>14s} {'emulated':>9s} {'err':>7s}   {'step ms real':>12s} "
          f"{'emulated':>9s} {'err':>7s} {'LOO host':>9s} {'err':>7s}   kernels real/emulated (GEMM, attention, "
          "element-wise)")
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg, batch, length, refs in CASES:
            if args.only and name not in args.only:
                continue
            for gpu, ref in refs:
                if not ref.exists():
                    continue
                real = step_summary(ref)
                cls = traced_model_class(ref)
                emu = step_summary(emulate(cfg, batch, length, gpu, Path(tmp) / f"{name}-{gpu}", model_class=cls))
                same_host = [r for n, _c, _b, _l, rs in CASES if n != name for g, r in rs if g == gpu and r.exists()]
                loo = step_summary(emulate(cfg, batch, length, gpu, Path(tmp) / f"{name}-{gpu}-loo", same_host, cls)
                                   ) if same_host else None
                dev_err = 100 * (emu["device_us"] - real["device_us"]) / real["device_us"]
                step_err = 100 * (emu["step_us"] - real["step_us"]) / real["step_us"]
                loo_err = 100 * (loo["step_us"] - real["step_us"]) / real["step_us"] if loo else None
                counts = ", ".join(f"{real['classes'][c]}/{emu['classes'][c]}" for c in CLASSES)
                print(f"{name:15s} {gpu:7s} {real['device_us'] / 1e3:14.2f} {emu['device_us'] / 1e3:9.2f} "
                      f"{dev_err:+6.1f}%   {real['step_us'] / 1e3:12.2f} {emu['step_us'] / 1e3:9.2f} {step_err:+6.1f}% "
                      + (f"{loo['step_us'] / 1e3:9.2f} {loo_err:+6.1f}%" if loo else f"{'-':>9s} {'-':>7s}")
                      + f"   {counts}", flush=True)
                rows.append({"model": name, "gpu": gpu, "reference": str(ref.relative_to(REPO.parent)),
                             "model_class": cls, "real": real, "emulated": emu, "loo": loo,
                             "device_error_pct": dev_err, "step_error_pct": step_err,
                             "step_error_pct_same_host": loo_err, "same_host_traces": [str(p) for p in same_host]})
    if rows:
        mape = sum(abs(r["device_error_pct"]) for r in rows) / len(rows)
        print(f"device-time MAPE {mape:.1f} % over {len(rows)} (model, GPU) pairs")
        print(f"step MAPE {sum(abs(r['step_error_pct']) for r in rows) / len(rows):.1f} % (shipped host table)")
        loo = [abs(r["step_error_pct_same_host"]) for r in rows if r["step_error_pct_same_host"] is not None]
        if loo:
            print(f"step MAPE {sum(loo) / len(loo):.1f} % over {len(loo)} with the host measured on the same "
                  "machine's other models (--host-from)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.readme and rows:
        print("\n".join(readme_blocks(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
