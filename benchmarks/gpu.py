"""On a GPU: ViT-B/16 and ViT-L/16 in bf16, vitkit against timm and timm + torch.compile, side by side.

One prepared command for a lent GPU machine; it stops starting new cases after --budget seconds (default 420,
so the whole run stays under 8 minutes) and records the ones it skipped:

    python benchmarks/gpu.py                  # writes benchmarks/results/gpu.{md,json}
    python benchmarks/gpu.py --no-compile     # eager only (compiling ViT-L takes minutes)
    python benchmarks/gpu.py --smoke          # seconds on a CPU: the pico model, to check the harness itself

Rows per model: inference with bf16 weights (vitkit and timm, eager and compiled; vitkit with SDPA pinned to
the flash and memory-efficient kernels; vitkit channels-last) and training steps under bf16 autocast (vitkit
eager and compiled, against timm eager and compiled). Timing is the harness of `vitkit bench`: paired
round-robin rounds, the ratio to timm is the median of the per-round ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

from vitkit.analysis.cost import model_cost
from vitkit.bench import (
    build_vitkit,
    infer_fn,
    machine_info,
    matmul_rates,
    train_fn,
    write_report,
)
from vitkit.peers import timm_twin
from vitkit.timing import paired_ratio, paired_times

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = {"vit_base_patch16_224": (256, 128), "vit_large_patch16_224": (128, 64)}  # inference, training batch
SMOKE = {"vit_pico_patch2_8": (4, 4)}


def _sdpa(backend: str | None):
    """A context that pins F.scaled_dot_product_attention to one kernel (None: torch's own choice)."""
    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "mem-efficient": SDPBackend.EFFICIENT_ATTENTION}[backend])


def _pinned(fn, backend: str | None):
    def call():
        with _sdpa(backend):
            return fn()
    return call


def _channels_last(model, x):
    """Inference with the model and input in channels-last layout (only the patch conv sees the difference)."""
    return copy.deepcopy(model).to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)


def infer_cases(name: str, batch: int, device: torch.device, compile_: bool) -> dict:
    vk = build_vitkit(name).to(device)
    tm = timm_twin(vk).to(device)
    C, (H, W) = vk.cfg.in_chans, vk.cfg.img_size
    x = torch.randn(batch, C, H, W, device=device)
    cases = {("vitkit", "eager"): infer_fn(vk, x, "bf16", "eager"), ("timm", "eager"): infer_fn(tm, x, "bf16", "eager")}
    if device.type == "cuda":  # the CPU has no memory-efficient kernel
        for kernel in ("flash", "mem-efficient"):
            cases[("vitkit", f"eager sdpa={kernel}")] = _pinned(infer_fn(vk, x, "bf16", "eager"), kernel)
    cases[("vitkit", "eager channels-last")] = infer_fn(*_channels_last(vk, x), "bf16", "eager")
    if compile_:
        cases[("vitkit", "compile")] = infer_fn(vk, x, "bf16", "compile")
        cases[("timm", "compile")] = infer_fn(tm, x, "bf16", "compile")
    return cases


def train_cases(name: str, batch: int, device: torch.device, compile_: bool) -> dict:
    vk = build_vitkit(name).to(device).train()
    tm = timm_twin(vk).to(device).train()
    C, (H, W) = vk.cfg.in_chans, vk.cfg.img_size
    x = torch.randn(batch, C, H, W, device=device)
    y = torch.randint(0, vk.num_classes, (batch,), device=device)
    fused = device.type == "cuda"
    cases = {("vitkit", "eager"): train_fn(vk, x, y, "bf16-autocast", "eager", fused_adamw=fused),
             ("timm", "eager"): train_fn(tm, x, y, "bf16-autocast", "eager", fused_adamw=fused)}
    if compile_:
        cases[("vitkit", "compile")] = train_fn(vk, x, y, "bf16-autocast", "compile", fused_adamw=fused)
        cases[("timm", "compile")] = train_fn(tm, x, y, "bf16-autocast", "compile", fused_adamw=fused)
    return cases


def rows_of(name, task, batch, precision, cases, warmup, repeats, peak) -> list[dict]:
    times = paired_times(cases, warmup, repeats)
    flops = 2 * model_cost(name, batch=batch).macs_total / 1e9 * (3 if task == "train" else 1)  # train: 3x forward
    out = []
    for (lib, backend), ts in times.items():
        ref = ("timm", "compile" if backend == "compile" else "eager")
        sec = statistics.median(ts)
        out.append({"model": name, "task": task, "batch": batch, "precision": precision, "backend": backend,
                    "library": lib, "img_per_s": batch / sec, "ms": 1e3 * sec, "gflops": flops / sec,
                    "peak_frac": flops / sec / peak,
                    "vs_timm": paired_ratio(times[ref], ts) if lib == "vitkit" and ref in times else None,
                    "vs_timm_ref": "/".join(ref) if lib == "vitkit" and ref in times else None})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--no-compile", action="store_true", help="eager cases only")
    p.add_argument("--smoke", action="store_true", help="a seconds-long run of the pico model on this machine's "
                   "CPU (no CUDA needed): checks the harness, measures nothing useful")
    p.add_argument("--budget", type=float, default=420, help="seconds after which no new case starts (default 420)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=str(RESULTS / "gpu"), help="OUT.md and OUT.json (default benchmarks/results/gpu)")
    args = p.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA device is visible; this benchmark needs a GPU (run it on a machine with "
              "one, or --smoke to check the harness on the CPU)", file=sys.stderr)
        return 2
    device = torch.device("cpu" if args.smoke else "cuda")
    models = SMOKE if args.smoke else MODELS
    compile_ = not (args.no_compile or args.smoke)
    warmup, repeats = (1, 2) if args.smoke else (3, args.repeats)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # this process only: fp32 parts of autocast as timm's train.py
    start = time.perf_counter()
    rates = matmul_rates(512 if args.smoke else 8192, repeats, device=device)
    peak = rates["bf16 torch.mm"]
    rows, skipped = [], []
    for name, (infer_batch, train_batch) in models.items():
        for task, batch, build, precision in (("infer", infer_batch, infer_cases, "bf16"),
                                              ("train", train_batch, train_cases, "bf16-autocast")):
            if time.perf_counter() - start > args.budget:
                skipped.append(f"{name} {task}")
                continue
            torch.manual_seed(0)
            rows += rows_of(name, task, batch, precision, build(name, batch, device, compile_), warmup, repeats, peak)
            print(f"{name} {task}: done at {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    report = {"command": "python benchmarks/gpu.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "options": {"models": list(models), "compile": compile_, "budget_s": args.budget, "smoke": args.smoke},
              "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "machine": machine_info(device), "clock": "wall", "warmup": warmup, "repeats": repeats,
              "matmul_peak_gflops": {"bf16": peak}, "matmul_gflops": rates, "rows": rows,
              "notes": (f"bf16: weights in bf16 (inference), autocast (training, AdamW fused on CUDA for both); "
                        f"'% peak' divides by the bf16 torch.mm rate measured in the same run; "
                        f"total {time.perf_counter() - start:.0f} s"
                        + (f"; skipped after the {args.budget:.0f} s budget: {', '.join(skipped)}" if skipped else ""))}
    md, js = write_report(report, args.out)
    print(f"wrote {md} and {js}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
