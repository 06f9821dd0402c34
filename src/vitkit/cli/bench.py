"""`vitkit bench`: vitkit against timm, side by side in one process, on this machine.

Both libraries get the same architecture, the same weights and the same input. Every case is timed
round-robin (A, B, C, then C, B, A, ...) after a warm-up, so a slow patch on a shared machine hits all
variants alike; the ratio to timm is the median of the per-round ratios. GFLOP/s counts 2 x MACs
(vitkit.analysis.cost; training = 3 x the forward), and "% peak" divides by the matmul rate measured in
the same run for the same dtype (the faster of torch.mm and oneDNN for fp32).
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .common import add_json, emit, positive_int, print_table

PRECISIONS = ("fp32", "bf16-autocast", "bf16")  # bf16 = weights and inputs in bf16
BACKENDS = ("eager", "compile", "onnx", "onnx-int8")
# the small-image training configuration of the speed issue: 32x32, patch 4, 192 wide, 6 deep
SMALL32 = {"img_size": 32, "patch_size": 4, "in_chans": 3, "num_classes": 10, "embed_dim": 192, "depth": 6,
           "num_heads": 3}


def register(sub) -> None:
    p = sub.add_parser("bench", help="time vitkit against timm (inference and training) on this machine")
    p.add_argument("--models", nargs="*", default=["vit_tiny_patch16_224", "vit_small_patch16_224"],
                   help="registered names, or 'small32' (the 32x32 patch-4 config); none to skip inference")
    p.add_argument("--batches", nargs="+", type=positive_int, default=[1, 8, 32])
    p.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=["eager", "compile"])
    p.add_argument("--train-models", nargs="*", default=["small32", "recipe:fashion-mnist"],
                   help="models for training steps (forward+backward+AdamW); none to skip")
    p.add_argument("--train-batch", type=positive_int, default=128)
    p.add_argument("--train-precisions", nargs="+", choices=PRECISIONS[:2], default=["fp32", "bf16-autocast"])
    p.add_argument("--warmup", type=positive_int, default=2)
    p.add_argument("--repeats", type=positive_int, default=7)
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (ONNX Runtime backends run on CPU only)")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall time, or process CPU time (steadier on a shared machine; use with --threads 1)")
    p.add_argument("--quick", action="store_true", help="a seconds-long smoke run: tiny models, few repeats")
    p.add_argument("--out", help="also write OUT.md and OUT.json")
    add_json(p)
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    if args.quick:
        args.models, args.batches, args.backends = ["vit_pico_patch2_8"], [2], ["eager"]
        args.precisions = ["fp32", "bf16"]
        args.train_models, args.train_batch, args.train_precisions = ["vit_pico_patch2_8"], 16, ["fp32"]
        args.warmup, args.repeats = 1, 3
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run_benchmarks(args)
    if args.out:
        write_report(report, args.out)
    emit(args, report, render)
    return 0


# ---------------------------------------------------------------------------- measuring
def _clock(kind: str) -> Callable[[], float]:
    return time.process_time if kind == "cpu" else time.perf_counter


def paired_times(fns: dict[str, Callable[[], Any]], warmup: int, repeats: int, clock: str = "wall",
                 min_sample: float = 0.02) -> dict[str, list[float]]:
    """Seconds per call of each fn, measured round-robin; the order reverses every round.

    A sample repeats a call that is faster than `min_sample` seconds (sized on the last warm-up call),
    so that timer resolution and scheduler noise stay small against what is measured."""
    now = _clock(clock)
    names = list(fns)
    calls = dict.fromkeys(names, 1)
    for _ in range(warmup):
        for name in names:
            t0 = now()
            fns[name]()
            calls[name] = max(1, min(1000, int(min_sample / max(now() - t0, 1e-6))))
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            t0 = now()
            for _ in range(calls[name]):
                fns[name]()
            times[name].append((now() - t0) / calls[name])
    return times


def paired_ratio(ref: list[float], other: list[float]) -> float:
    """Median over rounds of ref_time / other_time: > 1 means `other` is faster."""
    return statistics.median(r / o for r, o in zip(ref, other))


def matmul_rates(n: int, repeats: int, clock: str, device: str = "cpu") -> dict[str, float]:
    """GFLOP/s of an n x n matmul: torch.mm in fp32 and bf16, and oneDNN's fp32 matmul (the kernel
    vitkit's fp32 inference uses; on AMD CPUs torch.mm's MKL sgemm reaches about half of it)."""
    import torch

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a16, b16 = a.bfloat16(), b.bfloat16()
    fns = {"fp32 torch.mm": lambda: _sync(torch.mm(a, b)), "bf16 torch.mm": lambda: _sync(torch.mm(a16, b16))}
    if a.device.type == "cpu" and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        fns["fp32 oneDNN"] = lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
    with torch.no_grad():
        times = paired_times(fns, 2, repeats, clock)
    return {k: 2 * n**3 / statistics.median(t) / 1e9 for k, t in times.items()}


def machine_info(device=None) -> dict[str, Any]:
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    info = {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version()}
    if device is not None and device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    for lib in ("timm", "onnxruntime"):
        try:
            info[lib] = __import__(lib).__version__
        except ImportError:
            pass
    return info


# ---------------------------------------------------------------------------- the two libraries
def build_vitkit(name: str):
    """A registered name, 'small32', or 'recipe:NAME' (the model a training recipe builds)."""
    import vitkit

    if name == "small32":
        return vitkit.VisionTransformer(vitkit.ViTConfig(**SMALL32))
    if name.startswith("recipe:"):
        from ..training.recipes import get_recipe

        recipe = get_recipe(name.split(":", 1)[1])
        return vitkit.create_model(recipe.model, **recipe.model_args)
    return vitkit.create_model(name)


def timm_twin(model):
    """timm's VisionTransformer with the same architecture, holding the same weights (timm key names)."""
    from timm.models.vision_transformer import VisionTransformer as TimmViT

    from ..errors import ConfigError

    c = model.cfg
    if c.qk_norm or c.act != "gelu" or c.pos_embed == "none" or c.representation_size or c.distilled:
        raise ConfigError(f"{model.provenance.get('arch', 'model')}: bench compares plain ViTs with timm only")
    twin = TimmViT(img_size=c.img_size, patch_size=c.patch_size, in_chans=c.in_chans, num_classes=c.num_classes,
                   embed_dim=c.embed_dim, depth=c.depth, num_heads=c.num_heads, mlp_ratio=c.mlp_ratio,
                   qkv_bias=c.qkv_bias, init_values=c.init_values, class_token=c.class_token,
                   global_pool=c.global_pool, fc_norm=c.fc_norm, no_embed_class=not c.prefix_pos,
                   reg_tokens=c.num_reg_tokens, pre_norm=c.pre_norm, final_norm=c.final_norm)
    twin.load_state_dict(model.state_dict())
    twin.pos_embed.requires_grad_(model.pos_embed.requires_grad)  # a fixed sin-cos table stays fixed
    return twin


def gflop(model, batch: int) -> float:
    """Forward GFLOP for a batch: 2 x MACs from the closed-form cost model."""
    from ..analysis.cost import model_cost

    return 2 * model_cost(model.cfg, batch=batch).macs_total / 1e9


def _infer_fn(model, x, precision: str, backend: str, onnx_stem: Path):
    """A no-argument callable running one inference batch in the given precision and backend."""
    import torch

    if backend.startswith("onnx"):
        from ..export.onnx import OnnxRunner, export_onnx, quantize_int8

        path = onnx_stem.with_suffix(".onnx")
        if not path.exists():  # one export per model, reused across batch sizes
            export_onnx(model, path)
        if backend == "onnx-int8":
            int8 = onnx_stem.with_suffix(".int8.onnx")
            path = int8 if int8.exists() else quantize_int8(path, int8)
        runner, xn = OnnxRunner(path), x.numpy()
        return lambda: runner(xn)
    model = copy.deepcopy(model).eval().to(x.device)
    if precision == "bf16":
        model, x = model.to(torch.bfloat16), x.to(torch.bfloat16)
    if backend == "compile":
        import torch._inductor.config as inductor_config

        inductor_config.freezing = True  # constant-fold the weights: inference only
        model = torch.compile(model)
    autocast = precision == "bf16-autocast"

    def call():
        with torch.inference_mode(), torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            return _sync(model(x))

    return call


def _train_fn(model, x, y, precision: str, backend: str, fused_adamw: bool):
    import torch
    import torch.nn.functional as F

    model = copy.deepcopy(model).train().to(x.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05, **({"fused": True} if fused_adamw else {}))
    net = torch.compile(model) if backend == "compile" else model
    autocast = precision == "bf16-autocast"

    def step():
        with torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        _sync(loss)

    return step


def _sync(out):
    """Wait for the GPU so that the clock measures the work, not its launch."""
    import torch

    if isinstance(out, torch.Tensor) and out.is_cuda:
        torch.cuda.synchronize(out.device)
    return out


# ---------------------------------------------------------------------------- the run
def run_benchmarks(args) -> dict[str, Any]:
    import torch

    clock = args.clock
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        from ..errors import ConfigError

        raise ConfigError("--device cuda: no CUDA device is visible")
    rates = matmul_rates(1024 if args.quick else (8192 if device.type == "cuda" else 2048), args.repeats, clock, device)
    peaks = {"fp32": max(v for k, v in rates.items() if k.startswith("fp32")), "bf16": rates["bf16 torch.mm"]}
    rows: list[dict[str, Any]] = []
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="vitkit-bench-") as tmp:
        for name in args.models:
            vk = build_vitkit(name)
            tm = timm_twin(vk)
            C, (H, W) = vk.cfg.in_chans, vk.cfg.img_size
            for batch in args.batches:
                x = torch.randn(batch, C, H, W, device=device)
                flops = gflop(vk, batch)
                for precision in args.precisions:
                    fns, refs = {}, {}
                    for backend in args.backends:
                        if backend.startswith("onnx") and (precision != "fp32" or device.type != "cpu"):
                            continue  # ONNX Runtime runs the fp32 graph on CPU (int8 is its own precision)
                        fns[("vitkit", backend)] = _infer_fn(vk, x, precision, backend, Path(tmp) / name)
                        if backend in ("eager", "compile"):
                            fns[("timm", backend)] = _infer_fn(tm, x, precision, backend, Path(tmp) / name)
                        refs[("vitkit", backend)] = ("timm", backend if backend in ("eager", "compile") else "eager")
                    rows += _rows(name, "infer", batch, precision, fns, refs, flops, peaks, args)
        for name in args.train_models or []:
            vk = build_vitkit(name).train()
            tm = timm_twin(vk).train()
            C, (H, W) = vk.cfg.in_chans, vk.cfg.img_size
            b = args.train_batch
            x = torch.randn(b, C, H, W, device=device)
            y = torch.randint(0, max(vk.num_classes, 1), (b,), device=device)
            flops = 3 * gflop(vk, b)  # forward + backward (~2x forward)
            for precision in args.train_precisions:
                fns = {("timm", "eager"): _train_fn(tm, x, y, precision, "eager", fused_adamw=False),
                       ("vitkit", "eager"): _train_fn(vk, x, y, precision, "eager", fused_adamw=True)}
                if "compile" in args.backends:
                    fns[("vitkit", "compile")] = _train_fn(vk, x, y, precision, "compile", fused_adamw=True)
                refs = {k: ("timm", "eager") for k in fns if k[0] == "vitkit"}
                rows += _rows(name, "train", b, precision, fns, refs, flops, peaks, args)
    prog = f"python {sys.argv[0]}" if sys.argv[0].endswith(".py") else Path(sys.argv[0]).name
    return {"command": " ".join([prog, *(shlex.quote(a) for a in sys.argv[1:])]),
            "options": {k: v for k, v in vars(args).items() if k not in ("func", "json", "command", "verbose")},
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine_info(device), "clock": clock, "warmup": args.warmup, "repeats": args.repeats,
            "matmul_peak_gflops": peaks, "matmul_gflops": rates, "rows": rows,
            "notes": "training rows: vitkit uses AdamW(fused=True), timm the default AdamW; GFLOP = 2 x MACs, "
                     "training counts 3 x forward"}


def _rows(model, task, batch, precision, fns, refs, flops, peaks, args) -> list[dict[str, Any]]:
    times = paired_times(fns, args.warmup, args.repeats, args.clock)
    out = []
    for (lib, backend), ts in times.items():
        sec = statistics.median(ts)
        dtype_peak = peaks["bf16" if precision != "fp32" else "fp32"]
        ref = refs.get((lib, backend))
        out.append({
            "model": model, "task": task, "batch": batch, "precision": "int8" if backend == "onnx-int8" else precision,
            "backend": backend, "library": lib, "img_per_s": batch / sec, "ms": 1e3 * sec,
            "gflops": flops / sec, "peak_frac": None if backend == "onnx-int8" else flops / sec / dtype_peak,
            "vs_timm": paired_ratio(times[ref], ts) if ref else None, "vs_timm_ref": "/".join(ref) if ref else None,
        })
    return out


# ---------------------------------------------------------------------------- output
def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    opts = " ".join(f"{k}={v}" for k, v in report["options"].items())
    lines = [f"Command: `{report['command']}`  ", f"Options: {opts}  ", f"Date: {report['date']}  ",
             (f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['threads']} threads), "
              f"timm {m.get('timm', '-')}, onnxruntime {m.get('onnxruntime', '-')}"
              + (f", GPU {m['gpu']}" if "gpu" in m else "") + "  "),
             f"Clock: {report['clock']}; warm-up {report['warmup']}, median of {report['repeats']} round-robin repeats  ",
             "Matmul rates (square, the best per dtype is the '% peak' reference): "
             + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in report["matmul_gflops"].items()),
             "", "| model | task | batch | precision | backend | library | img/s | GFLOP/s | % peak | vs timm |",
             "|---|---|---:|---|---|---|---:|---:|---:|---|"]
    for r in report["rows"]:
        peak = "-" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%"
        ratio = "-" if r["vs_timm"] is None else f"{r['vs_timm']:.2f}x ({r['vs_timm_ref']})"
        lines.append(f"| {r['model']} | {r['task']} | {r['batch']} | {r['precision']} | {r['backend']} | "
                     f"{r['library']} | {r['img_per_s']:.1f} | {r['gflops']:.0f} | {peak} | {ratio} |")
    lines += ["", report["notes"], ""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out: str) -> None:
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.with_suffix(".md").write_text(markdown(report))
    out_path.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")


def render(report: dict[str, Any]) -> None:
    cols = ["model", "task", "B", "prec", "backend", "lib", "img/s", "GFLOP/s", "peak", "vs timm"]
    rows = [(r["model"], r["task"], r["batch"], r["precision"], r["backend"], r["library"], f"{r['img_per_s']:.1f}",
             f"{r['gflops']:.0f}", "-" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%",
             "-" if r["vs_timm"] is None else f"{r['vs_timm']:.2f}x") for r in report["rows"]]
    m = report["machine"]
    where = m.get("gpu") or f"{m['cpu']} ({m['threads']} threads)"
    print_table(f"vitkit vs timm on {where}, torch {m['torch']}", cols, rows)
    print("matmul GFLOP/s: " + ", ".join(f"{k} {v:.0f}" for k, v in report["matmul_gflops"].items()))
