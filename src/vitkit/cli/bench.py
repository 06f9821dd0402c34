"""`vitkit bench`: vitkit against timm, side by side in one process, on this machine (the harness is
vitkit.bench), or, with --latency, batch-1 latency per model and runtime (vitkit.latency); this module
parses, runs them and prints."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .common import emit, img_size, positive_int, print_json, print_table


def register(sub) -> None:
    from ..bench import BACKENDS, PRECISIONS, TRAIN_PRECISIONS, BenchOptions
    from ..latency import RUNTIMES, LatencyOptions

    _DEFAULTS, _LATENCY = BenchOptions(), LatencyOptions()
    p = sub.add_parser("bench", help="time vitkit against timm (inference and training) on this machine, or "
                       "batch-1 latency per model and runtime (--latency)")
    p.add_argument("--models", nargs="*", default=list(_DEFAULTS.models),
                   help="registered names, or 'small32' (the 32x32 patch-4 config); none to skip inference")
    p.add_argument("--batches", nargs="+", type=positive_int, default=list(_DEFAULTS.batches))
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(_DEFAULTS.precisions))
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(_DEFAULTS.backends))
    p.add_argument("--train-models", nargs="*", default=list(_DEFAULTS.train_models),
                   help="models for training steps (forward+backward+AdamW); none to skip")
    p.add_argument("--train-batch", type=positive_int, default=_DEFAULTS.train_batch)
    p.add_argument("--train-precisions", nargs="+", choices=TRAIN_PRECISIONS, default=list(_DEFAULTS.train_precisions))
    p.add_argument("--warmup", type=positive_int, default=None,
                   help=f"untimed calls first (default {_DEFAULTS.warmup}; --latency: {_LATENCY.warmup})")
    p.add_argument("--repeats", type=positive_int, default=_DEFAULTS.repeats)
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads during the run (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (ONNX Runtime backends run on CPU only)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall time, or process CPU time (steadier on a shared machine; use with --threads 1)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke run: tiny models, few repeats")
    p.add_argument("--control", action="store_true", help="also time a second timm model with the same weights beside "
                   "timm eager: its 'vs timm' is the noise floor of that column on this machine")
    p.add_argument("--out", help="also write OUT.md and OUT.json")
    p.add_argument("--explain", action="store_true", help="print the detected hardware and the fast paths vitkit "
                   "takes on it, with reasons (as `vitkit doctor`), and time nothing")
    lat = p.add_argument_group("batch-1 latency (--latency): run it on the device that will serve the model")
    lat.add_argument("--latency", action="store_true",
                     help="time batch-1 latency (p50/p90/p99) of --models across runtimes instead of vitkit vs timm")
    lat.add_argument("--runtimes", default=None, metavar=",".join(RUNTIMES),
                     help="comma-separated (default: all; those this machine cannot run are listed as skipped)")
    lat.add_argument("--runs", type=int, default=None, help=f"timed calls per model and runtime (default {_LATENCY.runs})")
    lat.add_argument("--img-size", type=img_size, default=None, help="build registered models at this size, e.g. 224")
    lat.add_argument("--data", default=None, help="also top-1 of each runtime on the split `vitkit eval` scores "
                     "(digits | fashion-mnist | FOLDER | MANIFEST.csv)")
    lat.add_argument("--limit", type=positive_int, default=None, help="with --data: the first N images only")
    lat.add_argument("--plot", default=None, metavar="PNG", help="latency vs top-1 (with --data) or latency bars")
    # `--json` alone prints the report on stdout; `--json FILE` writes it there and prints the table
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="FILE",
                   help="machine-readable report: on stdout, or written to FILE")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..bench import BenchOptions, run_benchmarks, write_report

    if args.explain:
        from . import doctor

        emit(args, doctor.report(), doctor.render)
        return 0
    if args.latency:
        return _run_latency(args)
    latency_only = [f for f in ("runtimes", "runs", "img_size", "data", "limit", "plot") if getattr(args, f) is not None]
    if latency_only:
        raise ConfigError(f"--{latency_only[0].replace('_', '-')} applies to --latency only")
    opts = BenchOptions(models=args.models, batches=args.batches, precisions=args.precisions, backends=args.backends,
                        train_models=args.train_models, train_batch=args.train_batch,
                        train_precisions=args.train_precisions,
                        warmup=BenchOptions.warmup if args.warmup is None else args.warmup, repeats=args.repeats,
                        threads=args.threads, device=args.device, clock=args.clock, control=args.control)
    report = run_benchmarks(opts.quick() if args.quick else opts, command=_command_line())
    if args.out:
        write_report(report, args.out)
    _emit(args, report, render)
    return 0


def _emit(args, report: dict[str, Any], render_table) -> None:
    """`--json`: the report on stdout; `--json FILE`: written there (atomically), and the table printed."""
    if args.json not in (None, "-"):
        from .._files import atomic_write_text

        atomic_write_text(args.json, json.dumps(report, indent=2, default=str) + "\n")
    if args.json == "-":
        print_json(report)
    else:
        render_table(report)


def _run_latency(args) -> int:
    from ..latency import RUNTIMES, LatencyOptions, run_latency, write_plot

    if args.limit is not None and args.data is None:
        raise ConfigError("--limit counts images of --data: give --data too")
    defaults = LatencyOptions()
    # checked by LatencyOptions (unknown runtime, --runs 0): one line each
    runtimes = tuple(t.strip() for t in args.runtimes.split(",")) if args.runtimes is not None else tuple(RUNTIMES)
    opts = LatencyOptions(models=args.models, runtimes=runtimes,
                          runs=defaults.runs if args.runs is None else args.runs,
                          warmup=defaults.warmup if args.warmup is None else args.warmup,
                          img_size=args.img_size, data=args.data, limit=args.limit, threads=args.threads)
    if args.device != "cpu":
        raise ConfigError("bench --latency times the CPU runtimes (torch, ONNX Runtime, OpenVINO): drop --device")
    report = run_latency(opts, command=_command_line())
    if args.plot:
        write_plot(report, args.plot)
    _emit(args, report, render_latency)
    return 0


def _command_line() -> str:
    prog = f"python {sys.argv[0]}" if sys.argv[0].endswith(".py") else Path(sys.argv[0]).name
    return " ".join([prog, *(shlex.quote(a) for a in sys.argv[1:])])


def render_latency(report: dict[str, Any]) -> None:
    has_top1 = any("top1" in r for r in report["rows"])
    cols = ["model", "params M", "GMACs", "runtime", "p50 ms", "p90 ms", "p99 ms", *(["top-1 %"] if has_top1 else [])]
    models = {m["model"]: m for m in report["models"]}
    rows, skipped = [], []
    for r in report["rows"]:
        m = models[r["model"]]
        if r["status"] != "ok":
            skipped.append(f"{r['runtime']}: {r['reason']}")
            continue
        rows.append((m.get("label", r["model"]), f"{m['params'] / 1e6:.2f}", f"{m['gmacs']:.3f}", r["runtime"], f"{r['p50_ms']:.2f}",
                     f"{r['p90_ms']:.2f}", f"{r['p99_ms']:.2f}",
                     *([f"{r['top1']:.2f}" if "top1" in r else "-"] if has_top1 else [])))
    m = report["machine"]
    print_table(f"batch-1 latency on {m['cpu']} ({m['threads']} threads), {report['runs']} runs after "
                f"{report['warmup']} warm-up", cols, rows)
    for line in dict.fromkeys(skipped):
        print(f"skipped {line}")
    for name, ev in report["eval"].items():
        print(f"top-1 of {name}: first {ev['count']} images of {report['data']} ({ev['split']} split)")


def render(report: dict[str, Any]) -> None:
    cols = ["model", "task", "B", "prec", "backend", "lib", "img/s", "GFLOP/s", "peak", "vs timm", "vs best peer"]
    rows = [(r["model"], r["task"], r["batch"], r["precision"],
             r["backend"] + (f" ({r['picked']})" if r.get("picked") else ""), r["library"], f"{r['img_per_s']:.1f}",
             f"{r['gflops']:.0f}", "-" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%",
             "-" if r["vs_timm"] is None else f"{r['vs_timm']:.2f}x",
             "-" if r.get("vs_best_peer") is None else f"{r['vs_best_peer']:.2f}x ({r['best_peer']})")
            for r in report["rows"]]
    m = report["machine"]
    where = m.get("gpu") or f"{m['cpu']} ({m['threads']} threads)"
    print_table(f"vitkit vs timm on {where}, torch {m['torch']}", cols, rows)
    print("matmul GFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_gflops"].items()))
