"""`vitkit bench`: vitkit against timm, side by side in one process, on this machine (the harness is
vitkit.bench; this module parses, runs it and prints)."""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

from .common import add_json, emit, positive_int, print_table


def register(sub) -> None:
    from ..bench import BACKENDS, PRECISIONS, TRAIN_PRECISIONS, BenchOptions

    _DEFAULTS = BenchOptions()
    p = sub.add_parser("bench", help="time vitkit against timm (inference and training) on this machine")
    p.add_argument("--models", nargs="*", default=list(_DEFAULTS.models),
                   help="registered names, or 'small32' (the 32x32 patch-4 config); none to skip inference")
    p.add_argument("--batches", nargs="+", type=positive_int, default=list(_DEFAULTS.batches))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(_DEFAULTS.precisions))
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(_DEFAULTS.backends))
    p.add_argument("--train-models", nargs="*", default=list(_DEFAULTS.train_models),
                   help="models for training steps (forward+backward+AdamW); none to skip")
    p.add_argument("--train-batch", type=positive_int, default=_DEFAULTS.train_batch)
    p.add_argument("--train-precisions", nargs="+", choices=TRAIN_PRECISIONS, default=list(_DEFAULTS.train_precisions))
    p.add_argument("--warmup", type=positive_int, default=_DEFAULTS.warmup)
    p.add_argument("--repeats", type=positive_int, default=_DEFAULTS.repeats)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads during the run (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (ONNX Runtime backends run on CPU only)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall time, or process CPU time (steadier on a shared machine; use with --threads 1)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke run: tiny models, few repeats")
    p.add_argument("--out", help="also write OUT.md and OUT.json")
    p.add_argument("--explain", action="store_true", help="print the detected hardware and the fast paths vitkit "
                   "takes on it, with reasons (as `vitkit doctor`), and time nothing")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bench import BenchOptions, run_benchmarks, write_report

    if args.explain:
        from . import doctor

        emit(args, doctor.report(), doctor.render)
        return 0
    opts = BenchOptions(models=args.models, batches=args.batches, precisions=args.precisions, backends=args.backends,
                        train_models=args.train_models, train_batch=args.train_batch,
                        train_precisions=args.train_precisions, warmup=args.warmup, repeats=args.repeats,
                        threads=args.threads, device=args.device, clock=args.clock)
    report = run_benchmarks(opts.quick() if args.quick else opts, command=_command_line())
    if args.out:
        write_report(report, args.out)
    emit(args, report, render)
    return 0


def _command_line() -> str:
    prog = f"python {sys.argv[0]}" if sys.argv[0].endswith(".py") else Path(sys.argv[0]).name
    return " ".join([prog, *(shlex.quote(a) for a in sys.argv[1:])])


def render(report: dict[str, Any]) -> None:
    cols = ["model", "task", "B", "prec", "backend", "lib", "img/s", "GFLOP/s", "peak", "vs timm"]
    rows = [(r["model"], r["task"], r["batch"], r["precision"], r["backend"], r["library"], f"{r['img_per_s']:.1f}",
             f"{r['gflops']:.0f}", "-" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%",
             "-" if r["vs_timm"] is None else f"{r['vs_timm']:.2f}x") for r in report["rows"]]
    m = report["machine"]
    where = m.get("gpu") or f"{m['cpu']} ({m['threads']} threads)"
    print_table(f"vitkit vs timm on {where}, torch {m['torch']}", cols, rows)
    print("matmul GFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_gflops"].items()))
