"""Batch-1 latency on this machine, per model and runtime (the harness behind `vitkit bench --latency`).

A serving device answers one request at a time, so what matters there is the time of one image, and its
tail: p50, p90 and p99 over `runs` timed calls after `warmup` untimed ones. Every (model, runtime) cell is
timed in the same round-robin (vitkit.timing.paired_times, the order reversed every round, one call per
sample), so a slow patch on a shared machine hits all alike. Runtimes are vitkit's own (`vitkit.runner`):
torch eager, ONNX Runtime (fp32, and int8 by dynamic quantisation of the same graph) and OpenVINO. A runtime
this CPU cannot run natively (bf16 without native bf16: it would be emulated and say nothing about the
device) or whose package is missing is listed as skipped with the reason, never timed.

With `data`, each runtime's top-1 on the first `limit` images of the split `vitkit eval` scores (the same
loader), so the int8 model's accuracy change is beside its speed-up.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, DataError, VitkitError

# runtime -> (vitkit.runner backend, precision); OpenVINO names its precisions f32/bf16
RUNTIMES = {
    "torch-fp32": ("torch", "fp32"), "torch-bf16": ("torch", "bf16"),
    "onnx-fp32": ("onnx", "fp32"), "onnx-int8": ("onnx", "int8"),
    "openvino-f32": ("openvino", "fp32"), "openvino-bf16": ("openvino", "bf16"),
}
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class LatencyOptions:
    """What to time. `models`: registered names (built at `img_size` when given) or anything `load_model`
    reads (a checkpoint, a run folder). `threads`: the torch / ONNX Runtime / OpenVINO threads (None: torch's)."""

    models: tuple[str, ...] = ("vit_tiny_patch16_224",)
    runtimes: tuple[str, ...] = tuple(RUNTIMES)
    runs: int = 50
    warmup: int = 10
    img_size: int | tuple[int, int] | None = None
    data: str | None = None
    limit: int | None = None
    threads: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "models", tuple(self.models or ()))
        object.__setattr__(self, "runtimes", tuple(dict.fromkeys(self.runtimes or ())))
        if not self.models:
            raise ConfigError("bench --latency needs at least one model (--models NAME ...)")
        bad = [r for r in self.runtimes if r not in RUNTIMES]
        if bad or not self.runtimes:
            raise ConfigError(f"bench --latency: unknown runtime {bad[0] if bad else ''!r}; "
                              f"choose from {', '.join(RUNTIMES)}")
        if int(self.runs) < 1:
            raise ConfigError(f"bench --latency: --runs must be at least 1 (the percentiles need timed runs), "
                              f"got {self.runs}")
        if int(self.warmup) < 0:
            raise ConfigError(f"bench --latency: --warmup must be 0 or more, got {self.warmup}")
        if self.limit is not None and int(self.limit) < 1:
            raise ConfigError(f"bench --latency: --limit must be at least 1, got {self.limit}")


def percentiles(samples_ms, qs=PERCENTILES) -> dict[str, float]:
    """{'p50': .., 'p90': .., 'p99': ..} of the samples, linearly interpolated between the order statistics
    (numpy's default), so they are ordered and never outside [min, max]."""
    import numpy as np

    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("percentiles of no samples")
    return {f"p{q}": float(np.percentile(a, q)) for q in qs}


def skip_reason(runtime: str) -> str | None:
    """Why this machine does not run `runtime`, in one line (None: it runs it)."""
    from .hardware import detect

    backend, precision = RUNTIMES[runtime]
    if precision == "bf16":
        caps = detect()
        if not caps.native_bf16:
            return f"no native bf16 on this CPU ({caps.kind}): bf16 would be emulated through fp32"
    try:
        if backend == "onnx":
            from .export.onnx import _import_onnx  # the one line naming the extra when a package is missing

            _import_onnx("onnx", "onnxruntime", *(("onnxruntime.quantization",) if precision == "int8" else ()))
        elif backend == "openvino":
            from .export.openvino import import_openvino

            import_openvino()
    except VitkitError as e:  # ExportError: the package is missing
        return str(e)
    return None


def build(spec: str, img_size=None):
    """A registered name (at `img_size` when given), else anything `load_model` reads, in eval mode."""
    from .api import create_model, load_model
    from .models import list_models

    base = spec.split(".", 1)[0]
    if base in list_models() or not os.path.exists(spec):  # an unknown name gets the registry's one line
        model = create_model(spec, **({"img_size": img_size} if img_size is not None else {}))
    else:
        model = load_model(spec, **({"img_size": img_size} if img_size is not None else {}))
    return model.eval()


def short_label(spec: str) -> str:
    """What the table and plot call a model: its name, or for a checkpoint file its run folder's name (a run's
    best/last.safetensors) or the file's stem."""
    if not os.path.exists(spec):
        return spec
    path = Path(spec)
    return path.parent.name if path.is_file() and path.stem in ("best", "last") and path.parent.name else path.stem


def model_gmacs(model) -> tuple[float, str]:
    """(forward GMACs of one image, how they were counted): the family's closed form where it has one
    (vitkit.analysis.cost), else torch's FlopCounterMode on one image on the meta device (convolutions and
    matmuls, as the closed forms count)."""
    import copy

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from .analysis.cost import model_cost
    from .models import get_family

    if get_family(model.family).cost is not None:
        return model_cost(model).macs_total / 1e9, "closed form"
    meta = copy.deepcopy(model).to("meta")  # no memory, no compute: only the shapes flow
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        meta(torch.empty(1, *model.preprocess.input_size, device="meta"))
    return counter.get_total_flops() / 2 / 1e9, "FlopCounterMode"


def _runners(model, runtimes, threads, folder: Path) -> dict[str, Any]:
    """runtime -> a vitkit.runner on `model`; ONNX runtimes share one export (fp32) and its int8 quantisation."""
    from .export.runner import runner

    out = {}
    onnx_path = folder / "model.onnx"
    for rt in runtimes:
        backend, precision = RUNTIMES[rt]
        if backend == "onnx":
            from .export.onnx import export_onnx, quantize_int8

            if not onnx_path.exists():
                export_onnx(model, onnx_path)
            path = quantize_int8(onnx_path, folder / "model.int8.onnx") if precision == "int8" else onnx_path
            out[rt] = runner(path, backend="onnx", precision="fp32", threads=threads)
        else:
            out[rt] = runner(model, backend=backend, precision=precision, threads=threads)
    return out


def _top1(model, runners: dict[str, Any], data: str, limit: int | None) -> dict[str, Any]:
    """Top-1 (%) of each runner on the first `limit` images of the split `vitkit eval MODEL --data DATA` scores."""
    from .data.datasets import eval_loader, load_eval_split
    from .export.onnx import compare_top1
    from .training.models import in_chans

    bundle, split, ds = load_eval_split(data, channels=in_chans(model), class_names=model.class_names)
    if model.num_classes != len(bundle.class_names):
        raise DataError(f"the model has {model.num_classes} outputs but {data} has {len(bundle.class_names)} classes")
    res = compare_top1(runners, eval_loader(ds, model.preprocess, limit=limit))
    return {"split": split, "count": res["count"], "top1": res["top1"]}


def versions() -> dict[str, str | None]:
    """torch, onnxruntime and openvino versions (None where not installed)."""
    out: dict[str, str | None] = {}
    for lib in ("torch", "onnxruntime", "openvino"):
        try:
            out[lib] = __import__(lib).__version__
        except ImportError:
            out[lib] = None
    return out


def run_latency(opts: LatencyOptions, command: str | None = None) -> dict[str, Any]:
    """Time every (model, runtime) of `opts` at batch 1; the report: machine, versions, one entry per model
    (params, GMACs) and one row per cell (p50/p90/p99 ms, or skipped with the reason; top-1 with data)."""
    import numpy as np
    import torch

    from .bench import machine_info
    from .runtime import torch_threads
    from .timing import paired_times

    skipped = {rt: skip_reason(rt) for rt in opts.runtimes}
    runnable = [rt for rt in opts.runtimes if skipped[rt] is None]
    models = {spec: build(spec, opts.img_size) for spec in opts.models}  # unknown names fail before any timing
    with torch_threads(opts.threads), tempfile.TemporaryDirectory(prefix="vitkit-latency-") as tmp:
        entries, fns, accuracy = [], {}, {}
        for i, (spec, model) in enumerate(models.items()):
            gmacs, counted = model_gmacs(model)
            shape = tuple(model.preprocess.input_size)  # (C, H, W)
            entries.append({"model": spec, "label": short_label(spec), "family": model.family, "img_size": list(shape[1:]),
                            "params": sum(p.numel() for p in model.parameters()), "gmacs": gmacs,
                            "gmacs_from": counted})
            folder = Path(tmp) / str(i)
            folder.mkdir()
            runners = _runners(model, runnable, opts.threads, folder)
            x = torch.randn(1, *shape, generator=torch.Generator().manual_seed(0))  # [1, C, H, W]
            for rt, run in runners.items():
                fns[(spec, rt)] = lambda run=run, x=x: run(x)
            if opts.data:
                accuracy[spec] = _top1(model, runners, opts.data, opts.limit)
        times = paired_times(fns, opts.warmup, opts.runs, min_sample=0.0)  # one call per sample
        machine = machine_info()
    rows = []
    for spec in opts.models:
        for rt in opts.runtimes:
            backend, precision = RUNTIMES[rt]
            row: dict[str, Any] = {"model": spec, "runtime": rt, "backend": backend, "precision": precision}
            if skipped[rt] is not None:
                rows.append(row | {"status": "skipped", "reason": skipped[rt]})
                continue
            ms = [1e3 * t for t in times[(spec, rt)]]
            row |= {"status": "ok", "reason": None, **{f"{k}_ms": v for k, v in percentiles(ms).items()},
                    "mean_ms": float(np.mean(ms)), "runs": len(ms), "samples_ms": ms}
            if spec in accuracy:
                row |= {"top1": accuracy[spec]["top1"][rt], "eval_count": accuracy[spec]["count"]}
            rows.append(row)
    return {"command": command, "options": dataclasses.asdict(opts),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine, "versions": versions(), "batch": 1, "runs": opts.runs, "warmup": opts.warmup,
            "data": opts.data, "eval": {k: {"split": v["split"], "count": v["count"]} for k, v in accuracy.items()},
            "models": entries, "rows": rows}


def write_plot(report: dict[str, Any], path: str | os.PathLike) -> Path:
    """The report as a PNG: p50 latency against top-1 (one marker per model x runtime) when it has top-1,
    else p50 bars with the p90 and p99 marked. Written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ._files import save_figure

    timed = [r for r in report["rows"] if r["status"] == "ok"]
    if not timed:
        raise ConfigError("bench --latency --plot: every runtime was skipped, so there is nothing to plot")
    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    runtimes = list(dict.fromkeys(r["runtime"] for r in timed))
    models = list(dict.fromkeys(r["model"] for r in timed))
    label = {m["model"]: m.get("label", m["model"]) for m in report["models"]}
    markers = "osD^vP*Xh<>"
    if all("top1" in r for r in timed):
        for r in timed:
            ax.scatter(r["p50_ms"], r["top1"], marker=markers[models.index(r["model"]) % len(markers)],
                       color=f"C{runtimes.index(r['runtime'])}", s=60)
        for i, m in enumerate(models):  # legend entries: shape = model, colour = runtime
            ax.scatter([], [], marker=markers[i % len(markers)], color="grey", label=label[m])
        for i, rt in enumerate(runtimes):
            ax.scatter([], [], marker="s", color=f"C{i}", label=rt)
        ax.set_xlabel("batch-1 latency p50 (ms)")
        ax.set_ylabel(f"top-1 % ({report['data']})")
        ax.legend(fontsize=8)
    else:
        labels = [f"{label[r['model']]}\n{r['runtime']}" for r in timed]
        p50 = [r["p50_ms"] for r in timed]
        ax.barh(range(len(timed)), p50, color=[f"C{runtimes.index(r['runtime'])}" for r in timed])
        ax.scatter([r["p90_ms"] for r in timed], range(len(timed)), marker="|", color="black", s=80, label="p90")
        ax.scatter([r["p99_ms"] for r in timed], range(len(timed)), marker="x", color="black", label="p99")
        ax.set_yticks(range(len(timed)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("batch-1 latency (ms): bar p50")
        ax.legend(fontsize=8)
    m = report["machine"]
    ax.set_title(f"batch-1 latency, {report['runs']} runs after {report['warmup']} warm-up: {m['cpu']} "
                 f"({m['threads']} threads), {report['date'][:10]}", fontsize=8)
    return save_figure(fig, path)
