"""vitkit against timm, side by side in one process, on this machine (the harness behind `vitkit bench`).

Both libraries get the same architecture, the same weights and the same input. Every case is timed
round-robin (A, B, C, then C, B, A, ...) after a warm-up, so a slow patch on a shared machine hits all
variants alike; the ratio to timm is the median of the per-round ratios. Beside timm eager, the peers a user
would pick instead run in the same rounds: timm + torch.compile (backend "compile") and OpenVINO called directly
on timm's model as its documentation shows (backend "openvino": convert_model, compile_model on the CPU with
INFERENCE_PRECISION_HINT, the run's thread count and the LATENCY hint); every vitkit row also gets its ratio
against the fastest peer of its (batch, precision). Backend "runner" is `vitkit.runner(model, backend="auto")`,
what vitkit's commands run (its pick measured on this machine). GFLOP/s counts 2 x MACs
(vitkit.analysis.cost; training = 3 x the forward), and "% peak" divides by the matmul rate measured in
the same run for the same dtype (the faster of torch.mm and oneDNN for fp32).

Nothing process-wide stays changed: the thread count is restored after the run, and torch.compile
gets its inductor options per compile.
"""
from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import os
import platform
import statistics
import subprocess
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .peers import check_twin, timm_twin, timm_vit_class
from .timing import CLOCKS, paired_ratio, paired_times

PRECISIONS = ("fp32", "bf16-autocast", "bf16")  # bf16 = weights and inputs in bf16
TRAIN_PRECISIONS = PRECISIONS[:2]
BACKENDS = ("eager", "compile", "onnx", "onnx-int8", "openvino", "runner")
TIMM_BACKENDS = ("eager", "compile")  # timm runs these too; every other backend's rows are compared with timm eager
PEERS = ("timm", "openvino")  # the libraries a vitkit row is compared with
# a second timm model with the same weights, timed in the same rounds as timm eager (BenchOptions.control): its "vs
# timm" is what identical kernels measure against each other here, the noise floor of that column; not a peer
CONTROL = "timm (control)"
# the small-image training configuration of the speed issue: 32x32, patch 4, 192 wide, 6 deep
SMALL32 = {"img_size": 32, "patch_size": 4, "in_chans": 3, "num_classes": 10, "embed_dim": 192, "depth": 6,
           "num_heads": 3}


@dataclass(frozen=True)
class BenchOptions:
    """What to time. Model names are registered names, 'small32' or 'recipe:NAME'; an empty tuple skips
    that part. `matmul_n` is the side of the square matmul that measures the peak (None: 8192 on a GPU,
    2048 on a CPU)."""

    models: tuple[str, ...] = ("vit_tiny_patch16_224", "vit_small_patch16_224")
    batches: tuple[int, ...] = (1, 8, 32)
    precisions: tuple[str, ...] = PRECISIONS
    backends: tuple[str, ...] = ("eager", "compile", "openvino", "runner")
    train_models: tuple[str, ...] = ("small32", "recipe:fashion-mnist")
    train_batch: int = 128
    train_precisions: tuple[str, ...] = TRAIN_PRECISIONS
    warmup: int = 2
    repeats: int = 7
    threads: int | None = None  # torch threads during the run (None: unchanged)
    device: str = "cpu"
    clock: str = "wall"  # or "cpu": process CPU time, steadier on a shared machine with threads=1
    matmul_n: int | None = None
    control: bool = False  # also time CONTROL beside each timm eager case

    def __post_init__(self):
        for name in ("models", "batches", "precisions", "backends", "train_models", "train_precisions"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        for name, allowed in (("precisions", PRECISIONS), ("backends", BACKENDS),
                              ("train_precisions", TRAIN_PRECISIONS)):
            bad = [v for v in getattr(self, name) if v not in allowed]
            if bad:
                raise ConfigError(f"bench {name}: {bad[0]!r} is not one of {', '.join(allowed)}")
        against_eager = [b for b in self.backends if b not in TIMM_BACKENDS]
        if self.models and against_eager and "eager" not in self.backends:
            raise ConfigError(f"bench backends: {against_eager[0]} is compared with timm eager, so the backends "
                              f"need eager too (--backends eager {' '.join(self.backends)})")
        if self.clock not in CLOCKS:
            raise ConfigError(f"bench clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}")
        counts = [*self.batches, self.train_batch, self.warmup, self.repeats, self.threads or 1, self.matmul_n or 1]
        if any(int(v) < 1 for v in counts):
            raise ConfigError("bench batch sizes, warm-up, repeats, threads and matmul size must be at least 1")

    def quick(self) -> BenchOptions:
        """A seconds-long smoke run: the pico model, few repeats (threads, device and clock kept). The peak
        matmul is 256 wide: on a CPU without bf16 instructions one 1024-wide bf16 torch.mm takes seconds."""
        return dataclasses.replace(
            self, models=("vit_pico_patch2_8",), batches=(2,), precisions=("fp32", "bf16"), backends=("eager",),
            train_models=("vit_pico_patch2_8",), train_batch=16, train_precisions=("fp32",), warmup=1,
            repeats=3, matmul_n=256)


# ---------------------------------------------------------------------------- measuring
SLOW_MATMUL_S = 2.0  # a matmul-rate call slower than this is timed once, not `repeats` times


def matmul_rates(n: int, repeats: int, clock: str = "wall", device: Any = "cpu") -> dict[str, float]:
    """GFLOP/s of an n x n matmul: torch.mm in fp32 and bf16, and oneDNN's fp32 matmul (the kernel
    vitkit's fp32 inference uses; on AMD CPUs torch.mm's MKL sgemm reaches about half of it)."""
    import torch

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    a16, b16 = a.bfloat16(), b.bfloat16()
    fns = {"fp32 torch.mm": lambda: _sync(torch.mm(a, b)), "bf16 torch.mm": lambda: _sync(torch.mm(a16, b16))}
    if a.device.type == "cpu" and hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        fns["fp32 oneDNN"] = lambda: torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")
    with torch.no_grad():
        # one call of each first: a kernel that slow is timed by that call alone (emulated bf16 under an AVX2 cap
        # took 44 s a call at n = 2048, so `--repeats 21` spent 17 minutes on this one rate)
        first = {k: paired_times({k: fn}, 0, 1, clock)[k] for k, fn in fns.items()}
        fast = {k: fn for k, fn in fns.items() if first[k][0] <= SLOW_MATMUL_S}
        times = first | paired_times(fast, 1, repeats, clock)
    return {k: 2 * n**3 / statistics.median(t) / 1e9 for k, t in times.items()}


def machine_info(device=None) -> dict[str, Any]:
    """CPU model, cores, torch/python versions, torch threads, the CPU kind with its instruction sets and the
    fast paths vitkit takes on `device` (vitkit.hardware), the GPU if `device` is one, and the versions of timm
    and onnxruntime where installed."""
    import torch

    model = platform.processor() or platform.machine()
    try:
        for line in subprocess.run(["lscpu"], check=False, capture_output=True, text=True, timeout=10).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    from .hardware import detect, this_machine

    caps = detect()
    dev_type = torch.device(device).type if device is not None else "cpu"
    info = {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "cpu_kind": caps.kind, "isa": caps.isa_flags(),
            "capabilities": caps.to_dict(), "fast_paths": this_machine(dev_type).to_dict()}
    if device is not None and torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    for lib in ("timm", "onnxruntime", "openvino"):
        try:
            info[lib] = __import__(lib).__version__
        except ImportError:
            pass
    return info


# ---------------------------------------------------------------------------- the two libraries
def build_vitkit(name: str):
    """A registered name, 'small32', or 'recipe:NAME' (the model a training recipe builds)."""
    from .api import create_model

    if name == "small32":
        from .models.config import ViTConfig
        from .models.vision_transformer import VisionTransformer

        return VisionTransformer(ViTConfig(**SMALL32))
    if name.startswith("recipe:"):
        from .training.recipes import get_recipe

        recipe = get_recipe(name.split(":", 1)[1])
        return create_model(recipe.model, **recipe.model_args)
    return create_model(name)


def gflop(model, batch: int) -> float:
    """Forward GFLOP for a batch: 2 x MACs from the closed-form cost model."""
    from .analysis.cost import model_cost

    return 2 * model_cost(model.cfg, batch=batch).macs_total / 1e9


def infer_fn(model, x, precision: str, backend: str, onnx_stem: Path | None = None) -> Callable[[], Any]:
    """A no-argument callable running one inference batch in the given precision and backend; it returns
    the output. The model is copied, never changed. ONNX backends export to `onnx_stem`.onnx (and
    .int8.onnx) once and reuse the files."""
    import torch

    if backend.startswith("onnx"):
        from .export.onnx import OnnxRunner, export_onnx, quantize_int8

        if onnx_stem is None:
            raise ConfigError(f"backend {backend} needs a folder for the exported model (onnx_stem)")
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
        # freezing constant-folds the weights (inference only); set for this compile, not process-wide
        model = torch.compile(model, options={"freezing": True})
    autocast = precision == "bf16-autocast"

    def call():
        with torch.inference_mode(), torch.autocast(x.device.type, torch.bfloat16, enabled=autocast):
            return _sync(model(x))

    return call


def openvino_fn(model, x, precision: str) -> Callable[[], Any]:
    """OpenVINO called directly on a (timm) model, as its documentation shows: convert_model from the module,
    compile_model on the CPU with the precision hint, this run's torch thread count and the LATENCY hint, one
    infer request reused. bf16 and bf16-autocast both ask OpenVINO for bf16."""
    import numpy as np
    import torch

    from .export.openvino import INFERENCE_PRECISION, import_openvino, shared_core

    ov = import_openvino()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's deprecation and shape-check warnings, pages of them
        graph = ov.convert_model(copy.deepcopy(model).eval().float(), example_input=x.float())
    config = {"INFERENCE_PRECISION_HINT": INFERENCE_PRECISION["fp32" if precision == "fp32" else "bf16"],
              "INFERENCE_NUM_THREADS": torch.get_num_threads(), "PERFORMANCE_HINT": "LATENCY"}
    request = shared_core().compile_model(graph, "CPU", config).create_infer_request()
    xn = np.ascontiguousarray(x.float().numpy())
    return lambda: request.infer([xn])


def runner_fn(model, x, precision: str) -> tuple[Callable[[], Any], str]:
    """vitkit.runner(model, backend="auto") at this batch size and precision (bf16-autocast asks for bf16), and
    what it picked ("backend/precision")."""
    from .export.runner import runner

    run = runner(copy.deepcopy(model).eval(), backend="auto", precision="fp32" if precision == "fp32" else "bf16",
                 batch_size=x.shape[0])
    streams = f" x{run.streams}" if run.streams > 1 else ""  # OpenVINO with the batch split across streams
    return (lambda: run(x)), f"{run.backend}{streams}/{run.precision}"


def train_fn(model, x, y, precision: str, backend: str, fused_adamw: bool) -> Callable[[], None]:
    """A no-argument callable running one AdamW training step on a copy of the model."""
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
def run_benchmarks(opts: BenchOptions, command: str | None = None) -> dict[str, Any]:
    """Time every case of `opts`; returns the report (machine, matmul peaks, one row per case).
    `command` is recorded as given (the command line that asked for the run)."""
    import torch

    from .runtime import torch_threads

    if opts.models or opts.train_models:
        timm_vit_class()  # fail before any timing: timm missing, or a model it has no twin for
        with torch.device("meta"):  # configs only: no weights are made here
            for name in dict.fromkeys((*opts.models, *opts.train_models)):
                check_twin(build_vitkit(name))
    device = torch.device(opts.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("bench device cuda: no CUDA device is visible")
    with torch_threads(opts.threads):
        rates = matmul_rates(opts.matmul_n or (8192 if device.type == "cuda" else 2048), opts.repeats, opts.clock,
                             device)
        peaks = {"fp32": max(v for k, v in rates.items() if k.startswith("fp32")), "bf16": rates["bf16 torch.mm"]}
        rows: list[dict[str, Any]] = []
        torch.manual_seed(0)
        with tempfile.TemporaryDirectory(prefix="vitkit-bench-") as tmp:
            for name in opts.models:
                rows += _infer_rows(name, opts, device, peaks, Path(tmp) / name)
            for name in opts.train_models:
                rows += _train_rows(name, opts, device, peaks)
        machine = machine_info(device)
    return {"command": command,
            "options": dataclasses.asdict(opts),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "machine": machine, "clock": opts.clock, "warmup": opts.warmup, "repeats": opts.repeats,
            "matmul_peak_gflops": peaks, "matmul_gflops": rates, "rows": rows,
            "notes": "training rows: vitkit uses AdamW(fused=True), timm the default AdamW; GFLOP = 2 x MACs, "
                     "training counts 3 x forward"}


def _infer_rows(name, opts: BenchOptions, device, peaks, onnx_stem: Path) -> list[dict[str, Any]]:
    import torch

    from .api import with_fast_paths

    vk = with_fast_paths(build_vitkit(name), device.type)
    tm = timm_twin(vk)
    C, (H, W) = vk.cfg.in_chans, vk.cfg.img_size
    rows = []
    for batch in opts.batches:
        x = torch.randn(batch, C, H, W, device=device)
        flops = gflop(vk, batch)
        for precision in opts.precisions:
            fns, refs, picks = {}, {}, {}
            for backend in opts.backends:
                if not _runs_here(backend, precision, device):
                    continue
                if backend == "openvino":
                    fns[("openvino", "direct")] = openvino_fn(tm, x, precision)
                    continue
                if backend == "runner":
                    fns[("vitkit", "runner")], picks[("vitkit", "runner")] = runner_fn(vk, x, precision)
                else:
                    fns[("vitkit", backend)] = infer_fn(vk, x, precision, backend, onnx_stem)
                if backend in TIMM_BACKENDS:
                    fns[("timm", backend)] = infer_fn(tm, x, precision, backend, onnx_stem)
                if backend == "eager" and opts.control:  # infer_fn copies the model: a second timm model
                    fns[(CONTROL, "eager")] = infer_fn(tm, x, precision, "eager", onnx_stem)
                    refs[(CONTROL, "eager")] = ("timm", "eager")
                refs[("vitkit", backend)] = ("timm", backend if backend in TIMM_BACKENDS else "eager")
            rows += _rows(name, "infer", batch, precision, fns, refs, flops, peaks, opts, picks)
    return rows


def _runs_here(backend: str, precision: str, device) -> bool:
    """ONNX Runtime runs the fp32 graph on CPU (int8 is its own precision); OpenVINO runs on CPU, bf16 only where
    the CPU has it natively (elsewhere it is emulated and says nothing); the runner has no bf16-autocast of its own
    (its bf16 is one row, under precision bf16)."""
    if backend.startswith("onnx"):
        return precision == "fp32" and device.type == "cpu"
    if backend == "openvino":
        from .hardware import detect

        return device.type == "cpu" and _have("openvino") and (precision == "fp32" or detect().native_bf16)
    if backend == "runner":
        return device.type == "cpu" and precision != "bf16-autocast"
    return True


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _train_rows(name, opts: BenchOptions, device, peaks) -> list[dict[str, Any]]:
    import torch

    from .api import with_fast_paths

    vk = with_fast_paths(build_vitkit(name), device.type).train()
    tm = timm_twin(vk).train()
    C, (H, W) = vk.cfg.in_chans, vk.cfg.img_size
    b = opts.train_batch
    x = torch.randn(b, C, H, W, device=device)
    y = torch.randint(0, max(vk.num_classes, 1), (b,), device=device)
    flops = 3 * gflop(vk, b)  # forward + backward (~2x forward)
    rows = []
    for precision in opts.train_precisions:
        fns = {("timm", "eager"): train_fn(tm, x, y, precision, "eager", fused_adamw=False),
               ("vitkit", "eager"): train_fn(vk, x, y, precision, "eager", fused_adamw=True)}
        if "compile" in opts.backends:
            fns[("vitkit", "compile")] = train_fn(vk, x, y, precision, "compile", fused_adamw=True)
        if opts.control:  # train_fn copies the model and makes its optimiser: a second timm model stepping alike
            fns[(CONTROL, "eager")] = train_fn(tm, x, y, precision, "eager", fused_adamw=False)
        refs = {k: ("timm", "eager") for k in fns if k[0] != "timm"}
        rows += _rows(name, "train", b, precision, fns, refs, flops, peaks, opts)
    return rows


def _rows(model, task, batch, precision, fns, refs, flops, peaks, opts: BenchOptions,
          picks: dict | None = None) -> list[dict[str, Any]]:
    times = paired_times(fns, opts.warmup, opts.repeats, opts.clock)
    peers = [k for k in times if k[0] in PEERS]
    best = min(peers, key=lambda k: statistics.median(times[k])) if peers else None
    out = []
    for (lib, backend), ts in times.items():
        sec = statistics.median(ts)
        dtype_peak = peaks["bf16" if precision != "fp32" else "fp32"]
        ref = refs.get((lib, backend))
        out.append({
            "model": model, "task": task, "batch": batch, "precision": "int8" if backend == "onnx-int8" else precision,
            "backend": backend, "library": lib, "img_per_s": batch / sec, "ms": 1e3 * sec,
            "gflops": flops / sec, "peak_frac": _peak_frac(flops / sec, dtype_peak, backend),
            "vs_timm": paired_ratio(times[ref], ts) if ref else None, "vs_timm_ref": "/".join(ref) if ref else None,
            "vs_best_peer": paired_ratio(times[best], ts) if best and lib == "vitkit" else None,
            "best_peer": "/".join(best) if best and lib == "vitkit" else None,
            **({"picked": picks[(lib, backend)]} if picks and (lib, backend) in picks else {}),
        })
    return out


def _peak_frac(gflops: float, peak: float, backend: str) -> float | None:
    """The model's rate as a fraction of the square-matmul peak; None for int8 (no int8 reference) and where the
    reference ran slower than the model (CPU bf16 without native support: torch.mm falls to a slow kernel the
    model's autocast layers do not use), since a fraction over 1 says nothing about headroom."""
    if backend == "onnx-int8" or peak <= 0 or gflops > peak:
        return None
    return gflops / peak


# ---------------------------------------------------------------------------- output
def markdown(report: dict[str, Any]) -> str:
    """The report as the Markdown that BENCHMARKS.md quotes."""
    m = report["machine"]
    opts = " ".join(f"{k}={v}" for k, v in report["options"].items())
    lines = [f"Command: `{report['command']}`  ", f"Options: {opts}  ", f"Date: {report['date']}  ",
             (f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['threads']} threads), "
              f"timm {m.get('timm', '-')}, onnxruntime {m.get('onnxruntime', '-')}, "
              f"openvino {m.get('openvino', '-')}"
              + (f", GPU {m['gpu']}" if "gpu" in m else "") + "  "),
             *([f"CPU kind: {m['cpu_kind']} ({', '.join(m['isa']) or 'no AVX2'}); fast paths on: "
                f"{', '.join(k for k, v in m['fast_paths']['paths'].items() if v['on']) or 'none'}  "]
               if "cpu_kind" in m else []),  # older result files have no capabilities
             f"Clock: {report['clock']}; warm-up {report['warmup']}, median of {report['repeats']} round-robin repeats  ",
             "Matmul rates (square, the best per dtype is the '% peak' reference): "
             + ", ".join(f"{k} {v:.3g} GFLOP/s" for k, v in report["matmul_gflops"].items()),
             "", "| model | task | batch | precision | backend | library | img/s | GFLOP/s | % peak | vs timm | "
             "vs best peer |",
             "|---|---|---:|---|---|---|---:|---:|---:|---|---|"]
    for r in report["rows"]:
        peak = "-" if r["peak_frac"] is None else f"{100 * r['peak_frac']:.0f}%"
        ratio = "-" if r["vs_timm"] is None else f"{r['vs_timm']:.2f}x ({r['vs_timm_ref']})"
        best = "-" if r.get("vs_best_peer") is None else f"{r['vs_best_peer']:.2f}x ({r['best_peer']})"
        backend = r["backend"] + (f" ({r['picked']})" if r.get("picked") else "")
        lines.append(f"| {r['model']} | {r['task']} | {r['batch']} | {r['precision']} | {backend} | "
                     f"{r['library']} | {r['img_per_s']:.1f} | {r['gflops']:.0f} | {peak} | {ratio} | {best} |")
    if any(r["library"] == CONTROL for r in report["rows"]):
        lines += ["", f"{CONTROL}: a second timm model with the same weights, timed in the same rounds as timm eager; "
                  "its 'vs timm' is what identical kernels measure against each other here (the column's noise floor)."]
    lines += ["", report["notes"], ""]
    return "\n".join(lines)


def write_report(report: dict[str, Any], out: str | os.PathLike) -> tuple[Path, Path]:
    """OUT.md (markdown) and OUT.json (the report as data)."""
    out_path = Path(out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    md, js = out_path.with_suffix(".md"), out_path.with_suffix(".json")
    md.write_text(markdown(report))
    js.write_text(json.dumps(report, indent=2) + "\n")
    return md, js
