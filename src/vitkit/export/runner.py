"""`vitkit.runner`: one callable on preprocessed [B, C, H, W] float batches, whatever runs it.

    run = vitkit.runner("bundled:vit_fashion_mnist", backend="openvino")
    logits = run(batch)              # [B, K]; run.backend, run.precision say what was chosen

Backends: torch (eager), compile (torch.compile), onnx (ONNX Runtime: an .onnx file, or the model exported
on first use), openvino (an IR folder, or the model converted on first use and cached by content hash; see
export/openvino.py). `features=True` gives the pooled features [B, D] instead of the logits.

"auto" picks the fastest of torch, OpenVINO (its graph compiled for the batch size at hand; one stream, and where
the batch and threads allow, a stream per thread each running a slice of the batch) and ONNX Runtime (those
installed; ONNX Runtime only for logits and where fp32 is allowed: it has no bf16) for the batch size at hand by a
short paired measurement (vitkit.timing; leaders within CLOSE_CALL of each other timed again, longer), cached per
machine (hardware.machine_key plus the OpenVINO version) and model in $VITKIT_CACHE/runtimes.json; with
VITKIT_MEASURE=0 it is torch. A corrupt or unwritable cache means measuring again, never a crash. Precision "auto"
is the machine's inference decision (vitkit.hardware: bf16 only where the CPU has native bf16).
"""
from __future__ import annotations

import contextlib
import copy
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..errors import ConfigError
from .inference_only import InferenceOnly

BACKENDS = ("auto", "torch", "compile", "onnx", "openvino")
PRECISIONS = ("auto", "fp32", "bf16")
AUTO_CANDIDATES = ("torch", "openvino", "onnx")  # what "auto" measures (compile's first call alone takes longer)
# Leaders whose 5-round medians are this close are timed again, longer and against each other: on a 2-core Zen 4
# ONNX Runtime and OpenVINO measured 0.5% apart for ViT-B/16 at batch 1, and the pick then ran 0.97x the other
# in `vitkit bench`'s rounds (BENCHMARKS.md, the runtimes comparison on a Zen 4 again)
CLOSE_CALL = 0.03
CLOSE_CALL_REPEATS = 15
AUTO_BATCH = 8  # the batch "auto" measures at when the caller names none
# bumped when what "auto" times changes, so older cache entries are measured again (2: OpenVINO on a graph with
# the batch fixed)
METHOD = 2


class Runner(InferenceOnly):
    """A model behind one call: `run(images)` -> logits (or features) [B, ...], as a torch tensor for a tensor
    input. Carries what predict/eval read of a model: preprocess, class_names, num_classes, cfg, provenance."""

    untrainable = "a runner is for inference: train the model itself"

    def __init__(self, call: Callable, backend: str, precision: str, source: Any, features: bool):
        self._call, self.backend, self.precision, self.features = call, backend, precision, features
        self.streams = getattr(call, "streams", 1)  # OpenVINO's streams a batch is split across (1 elsewhere)
        for name in ("preprocess", "class_names", "num_classes", "cfg", "provenance", "family", "num_features"):
            setattr(self, name, getattr(source, name, None))
        self.provenance = dict(self.provenance or {})

    def __call__(self, images):
        as_tensor = isinstance(images, torch.Tensor)
        with torch.no_grad():
            out = self._call(images if as_tensor else torch.as_tensor(images, dtype=torch.float32))
        out = out if isinstance(out, torch.Tensor) else torch.as_tensor(out)
        return out.float() if as_tensor else out.float().numpy()

    def __repr__(self) -> str:
        return (f"Runner(backend={self.backend!r}, precision={self.precision!r}, features={self.features}"
                + (f", streams={self.streams})" if self.streams > 1 else ")"))


def runner(model_or_path, backend: str = "auto", precision: str = "auto", *, features: bool = False,
           batch_size: int | None = None, threads: int | None = None, streams: int = 1) -> Runner:
    """A Runner for a model, a checkpoint (anything `load_model` reads), an .onnx file or an OpenVINO IR folder.

    `backend`: auto | torch | compile | onnx | openvino; `precision`: auto | fp32 | bf16 (bf16 where the
    backend has it: torch, compile, openvino). `batch_size`: the batch the runner is built for: "auto" measures
    at it (8 when not given), and OpenVINO compiles its graph with that batch fixed (other sizes still run, on a
    batch-dynamic graph compiled when first needed). `streams`: OpenVINO streams a batch is split across (1:
    OpenVINO's LATENCY hint); "auto" measures 1 against one per thread."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    exported = _exported_backend(model_or_path)
    if exported and backend not in ("auto", exported):
        raise ConfigError(f"{model_or_path} is an exported {exported} model: it runs with backend {exported}, "
                          f"not {backend}")
    if exported:
        return _build(model_or_path, exported, _precision(precision, exported), features, threads, streams,
                      batch_size)
    model = _load(model_or_path)
    if backend == "auto":
        batch_size = batch_size or AUTO_BATCH
        backend, streams = _auto_backend(model, precision, features, batch_size, threads)
    return _build(model, backend, _precision(precision, backend), features, threads, streams, batch_size)


def _exported_backend(source) -> str | None:
    """"onnx" for an .onnx file, "openvino" for an IR folder, None for a model or checkpoint."""
    if isinstance(source, (str, os.PathLike)):
        from .openvino import is_ir_folder

        if str(source).lower().endswith(".onnx"):
            return "onnx"
        if is_ir_folder(source):
            return "openvino"
    return None


def _load(source):
    if isinstance(source, torch.nn.Module):
        return source
    from ..api import load_model

    return load_model(source)


def _precision(asked: str, backend: str) -> str:
    """The precision to run: "auto" is the machine's inference decision; ONNX Runtime runs fp32 only."""
    if asked == "auto":
        from ..hardware import this_machine

        asked = "bf16" if this_machine().bf16 and backend != "onnx" else "fp32"
    if asked == "bf16" and backend == "onnx":
        raise ConfigError("the ONNX backend runs fp32 only: use precision fp32, or backend torch or openvino for bf16")
    return asked


def _build(source, backend: str, precision: str, features: bool, threads: int | None, streams: int = 1,
           batch_size: int | None = None) -> Runner:
    if streams != 1 and backend != "openvino":
        raise ConfigError(f"streams split a batch across OpenVINO's streams: backend {backend} runs one")
    if backend == "openvino":
        from .openvino import OpenVinoRunner, check_precision, converted

        check_precision(precision)  # before converting: bf16 on a CPU without it is refused at once
        folder = source if _exported_backend(source) else converted(source, "features" if features else "logits")
        ov = OpenVinoRunner(folder, precision=precision, threads=threads, streams=streams, batch_size=batch_size)
        if (ov.output == "features") != features:
            raise ConfigError(f"{folder} gives {ov.output}, not {'features' if features else 'logits'}: export it "
                              f"{'with' if features else 'without'} features, or give the checkpoint")
        return Runner(ov, backend, precision, ov, features)
    if backend == "onnx":
        from .onnx import OnnxRunner, export_onnx

        if features:
            raise ConfigError("the ONNX backend gives logits only: use backend torch or openvino for features")
        path = source
        if not _exported_backend(source):  # exported on first use, cached by content hash like OpenVINO's IR
            from .openvino import cache_folder, model_digest

            path = cache_folder().parent / "onnx" / f"{model_digest(source)}.onnx"
            if not path.is_file():  # written aside and renamed once checked: a cached file is always whole
                staging = path.with_name(f".{path.stem}.{os.getpid()}.tmp.onnx")
                try:
                    export_onnx(source, staging)
                    os.replace(staging, path)
                finally:
                    staging.unlink(missing_ok=True)
        onnx = OnnxRunner(path, threads=threads)
        return Runner(onnx, backend, precision, onnx, features)
    model = source.eval()
    # bf16 runs a bf16 copy of the weights (the caller's model stays as it is): on an idle 2-core Xeon with AMX it
    # measured 1.06-1.30x autocast for ViT-S/16 and B/16 at batch 1 and 8, with the same error against fp32,
    # because bf16 weights let the blocks take the fused encoder-layer kernel, which autocast rules out
    net = copy.deepcopy(model).to(torch.bfloat16) if precision == "bf16" else model
    forward = (lambda x: net.forward_head(net.forward_features(x), pre_logits=True)) if features else net
    if backend == "compile":
        forward = torch.compile(forward)
    if precision == "bf16":
        def call(x):
            return forward(x.to(torch.bfloat16))
    else:
        call = forward
    return Runner(call, backend, precision, model, features)


# ------------------------------------------------------------------------------------- "auto": measured
def _cache_file() -> Path:
    from ..hardware import cache_file

    return cache_file().parent / "runtimes.json"


def split_streams(batch_size: int, threads: int | None = None) -> int:
    """How many OpenVINO streams a batch is split across when it is split: one a thread, at most one an image."""
    return min(batch_size, int(threads or torch.get_num_threads()))


def _auto_candidates(precision: str, features: bool, batch_size: int, threads: int | None) -> dict[str, tuple[str, int]]:
    """What "auto" times, by name: {name: (backend, streams)}. Each of AUTO_CANDIDATES that can run, and OpenVINO
    a second time with one stream per thread ("openvino x2") where the batch can be split that far."""
    out: dict[str, tuple[str, int]] = {}
    split = split_streams(batch_size, threads)
    for b in AUTO_CANDIDATES:
        if _can_run(b, precision, features):
            out[b] = (b, 1)
            if b == "openvino" and split > 1:
                out[f"openvino x{split}"] = (b, split)
    return out


def _auto_backend(model, precision: str, features: bool, batch_size: int, threads: int | None) -> tuple[str, int]:
    """(backend, streams): the fastest of `_auto_candidates` for this model at this batch size on this machine,
    measured once."""
    from ..hardware import ENV_MEASURE, detect, machine_key

    candidates = _auto_candidates(precision, features, batch_size, threads)
    if os.environ.get(ENV_MEASURE, "1") == "0" or len(candidates) == 1:
        return "torch", 1
    from .openvino import model_digest, openvino_version

    chosen = {name: _precision(precision, b) for name, (b, _) in candidates.items()}
    key = " | ".join([f"method {METHOD}", machine_key(detect()), f"openvino {openvino_version()}",
                      model_digest(model), f"batch {batch_size}", "features" if features else "logits",
                      ",".join(f"{b}:{p}" for b, p in chosen.items())])
    path = _cache_file()
    try:
        cache = json.loads(path.read_text()) if path.exists() else {}
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}  # an unreadable cache: measure again, and replace it
    if cache.get(key, {}).get("backend") in candidates:
        return candidates[cache[key]["backend"]]
    from ..weights.notes import note_once

    note_once(f"timing {' vs '.join(candidates)} once for this model at batch {batch_size} (cached in {path})")
    C, (H, W) = model.cfg.in_chans, model.cfg.img_size
    x = torch.randn(batch_size, C, H, W, generator=torch.Generator().manual_seed(0))
    runs = {name: _build(model, b, chosen[name], features, threads, streams, batch_size)
            for name, (b, streams) in candidates.items()}
    best, medians, close = fastest({b: (lambda r=r: r(x)) for b, r in runs.items()})
    cache[key] = {"backend": best, "seconds_per_batch": medians, **({"close_call": close} if close else {})}
    with contextlib.suppress(OSError):  # unwritable: this process keeps its answer, the next one measures again
        from .._files import atomic_write_text

        atomic_write_text(path, json.dumps(cache, indent=2) + "\n")
    return candidates[best]


def fastest(calls: dict[str, Callable[[], Any]], close_call: float = CLOSE_CALL
            ) -> tuple[str, dict[str, float], list[str]]:
    """(the fastest name, seconds per call by name, the close call): 5 paired rounds of every call; where others
    are within `close_call` of the fastest, those leaders again for CLOSE_CALL_REPEATS rounds among themselves,
    the pick then the fastest by the median of per-round ratios (their medians replace the short ones)."""
    from ..timing import paired_ratio, paired_times

    times = paired_times(calls, warmup=2, repeats=5)
    medians = {n: statistics.median(t) for n, t in times.items()}
    best = min(medians, key=medians.get)
    close = [n for n in medians if medians[n] <= medians[best] * (1 + close_call)]
    if len(close) == 1:
        return best, medians, []
    again = paired_times({n: calls[n] for n in close}, warmup=1, repeats=CLOSE_CALL_REPEATS)
    medians.update({n: statistics.median(t) for n, t in again.items()})
    best = max(close, key=lambda n: paired_ratio(again[close[0]], again[n]))  # [n]'s speed-up over close[0]
    return best, medians, close


def _can_run(backend: str, precision: str, features: bool) -> bool:
    """Whether "auto" may pick `backend`: installed, and able to give what was asked."""
    import importlib.util

    if backend == "openvino":
        return importlib.util.find_spec("openvino") is not None
    if backend == "onnx":
        return importlib.util.find_spec("onnxruntime") is not None and precision != "bf16" and not features
    return True
