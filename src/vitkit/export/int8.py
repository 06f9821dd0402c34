"""Is the int8 model worth shipping? Its speed-up over the fp32 ONNX graph beside its top-1 change against
PyTorch, on the split `vitkit eval` would score (`vitkit export --int8`, benchmarks/int8.py)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ..timing import paired_ratio, paired_times
from .onnx import OnnxRunner, compare_top1, quantize_int8

INT8_MAX_DROP_POINTS = 0.5  # int8 top-1 may fall this many points below PyTorch's before `export` warns
INT8_MIN_SPEEDUP = 1.2  # and must run at least this much faster than the fp32 ONNX graph


def int8_report(model, onnx_path: str | os.PathLike, eval_data: str | None = None, eval_limit: int | None = None,
                batch: int = 8, repeats: int = 7, max_drop: float = INT8_MAX_DROP_POINTS,
                min_speedup: float = INT8_MIN_SPEEDUP) -> dict[str, Any]:
    """Quantise an exported fp32 graph to ONNX_PATH.int8.onnx and measure it: its speed-up over the fp32
    graph (paired timing of one random batch) and, with `eval_data`, the top-1 of PyTorch, ONNX fp32 and
    int8 on that dataset's held-out split (at most `eval_limit` images). `warning` is one line when the int8
    model is not worth shipping as measured (`int8_warning`), else None."""
    onnx_path = Path(onnx_path)
    q_path = quantize_int8(onnx_path, onnx_path.with_suffix(".int8.onnx"))
    fp32, int8 = OnnxRunner(onnx_path), OnnxRunner(q_path)
    shape = (batch, model.cfg.in_chans, *model.cfg.img_size)  # [B, C, H, W]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    t = paired_times({"fp32": lambda: fp32(x), "int8": lambda: int8(x)}, 2, repeats)
    out: dict[str, Any] = {"path": str(q_path), "speedup_vs_fp32_onnx": paired_ratio(t["fp32"], t["int8"])}
    if eval_data:
        acc = compare_top1({"pytorch": model, "onnx": fp32, "int8": int8}, _eval_batches(model, eval_data, eval_limit))
        out["accuracy"] = acc
        out["eval_data"] = eval_data
        out["top1_change_points"] = acc["top1"]["int8"] - acc["top1"]["pytorch"]
    out["thresholds"] = {"max_drop_points": max_drop, "min_speedup": min_speedup}
    out["warning"] = int8_warning(out, max_drop, min_speedup)
    return out


def int8_warning(report: dict[str, Any], max_drop: float = INT8_MAX_DROP_POINTS,
                 min_speedup: float = INT8_MIN_SPEEDUP) -> str | None:
    """One line when an `int8_report` says the int8 model costs more than `max_drop` top-1 points against
    PyTorch (only measured with eval data) or is less than `min_speedup` times faster than the fp32 ONNX
    graph; None when it is worth it."""
    problems = []
    change = report.get("top1_change_points")
    if change is not None and -change > max_drop:
        on = f" on {report['eval_data']}" if report.get("eval_data") else ""
        problems.append(f"top-1 drops {-change:.2f} points{on} (more than {max_drop:g})")
    speedup = report["speedup_vs_fp32_onnx"]
    if speedup < min_speedup:
        problems.append(f"only {speedup:.2f}x the speed of the fp32 ONNX model (under {min_speedup:g}x)")
    if not problems:
        return None
    return (f"warning: int8 model {Path(report['path']).name}: {' and '.join(problems)}; "
            "consider shipping the fp32 model")


def _eval_batches(model, data: str, limit: int | None):
    """The labelled batches `vitkit eval MODEL --data DATA` scores (the project's one eval-split loader),
    labels on the model's classes, the first `limit` images at most."""
    from ..data.datasets import eval_loader, load_eval_split

    _, _, ds = load_eval_split(data, channels=int(model.preprocess.input_size[0]), class_names=model.class_names)
    return eval_loader(ds, model.preprocess, limit=limit)
