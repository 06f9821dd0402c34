"""OpenVINO as a runtime beside PyTorch and ONNX Runtime: an IR folder written with a parity check, and a
runner that stands in for the model in predict/eval.

An IR folder holds `model.xml` + `model.bin` (the graph and its fp32 weights: never compressed to fp16, so
f32 inference equals PyTorch) and `vitkit.json` (family, config, preprocessing, class names, provenance, the
OpenVINO version that wrote it and whether the graph gives logits or pooled features). The batch is dynamic;
the image size is the model's.

OpenVINO is called as its documentation shows: `ov.convert_model(module, example_input=...)`,
`ov.save_model(..., compress_to_fp16=False)`, `Core().compile_model(model, "CPU", {INFERENCE_PRECISION_HINT,
INFERENCE_NUM_THREADS, PERFORMANCE_HINT: LATENCY})`; with `streams=N` the THROUGHPUT hint and N streams instead,
a batch split into N slices run at once. A runner built for a batch size compiles that batch's shape fixed. bf16 runs
only where the CPU has native bf16 (`vitkit.hardware`): elsewhere OpenVINO would quietly compute in f32, and vitkit
says so instead.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import ConfigError
from ..models import Preprocess, get_family
from .inference_only import InferenceOnly
from .onnx import ExportError

IR_XML, IR_BIN, META_FILE = "model.xml", "model.bin", "vitkit.json"
IR_FILES = (IR_XML, IR_BIN, META_FILE)
# vitkit's precision names -> OpenVINO's INFERENCE_PRECISION_HINT values
INFERENCE_PRECISION = {"fp32": "f32", "bf16": "bf16"}
OUTPUTS = ("logits", "features")


def import_openvino():
    """The openvino package (the `openvino` extra), or one ExportError naming the install command."""
    try:
        import openvino
    except ImportError:
        raise ExportError("--backend openvino and export --openvino need openvino, which is not installed: "
                          "pip install 'vitkit[openvino]'") from None
    return openvino


@functools.cache
def shared_core():
    """The process's one `openvino.Core`, made on first use and kept until exit.

    OpenVINO's CPU plugin (one per Core) swaps the creating thread's signal stack for its own and unmaps it when
    the plugin is destroyed, putting back the stack it replaced. Two Cores released in the order they were made
    (not last-in-first-out, as garbage collection may) leave the thread on an unmapped signal stack: the next
    signal delivered to that thread with a Python handler (SIGCHLD, SIGTERM, ...) kills the process with a
    segmentation fault. One Core that is never released cannot interleave."""
    return import_openvino().Core()


def openvino_version() -> str:
    return import_openvino().__version__.split("-")[0]  # "2026.4.1-22982-..." -> "2026.4.1"


class PooledFeatures(nn.Module):
    """The model's pooled features (`forward_head(pre_logits=True)`, the width of `num_features`) as its output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.forward_head(self.model.forward_features(x), pre_logits=True)  # [B, num_features]


def check_precision(precision: str) -> str:
    """`precision` ("fp32" or "bf16") when this CPU can run it; bf16 without native bf16 is one ConfigError."""
    from ..hardware import detect

    if precision not in INFERENCE_PRECISION:
        raise ConfigError(f"OpenVINO precision must be one of {', '.join(INFERENCE_PRECISION)}, got {precision!r}")
    caps = detect()
    if precision == "bf16" and not caps.native_bf16:
        raise ConfigError(f"bf16 in OpenVINO needs native bf16 on the CPU; this one is {caps.kind} (OpenVINO would "
                          "compute in f32): use --precision fp32")
    return precision


def export_openvino(model: nn.Module, folder: str | os.PathLike, *, output: str = "logits",
                    tol: float = 1e-4) -> dict[str, Any]:
    """Write `model` (fp32, eval) as an OpenVINO IR folder and check it against PyTorch (f32, batch 2 and 3).

    `output`: "logits" or "features" (pooled). The folder appears whole or not at all (written beside it, then
    renamed). Returns {"path", "max_abs_diff", "checked_shapes", "openvino", "output"}; raises ExportError when
    OpenVINO cannot convert the model or its outputs differ from PyTorch's by more than `tol`."""
    ov = import_openvino()
    if output not in OUTPUTS:
        raise ConfigError(f"output must be one of {', '.join(OUTPUTS)}, got {output!r}")
    net = copy.deepcopy(model).float().eval()  # the caller's model keeps its dtype and mode
    graph = PooledFeatures(net).eval() if output == "features" else net
    C, (H, W) = net.cfg.in_chans, net.cfg.img_size
    gen = torch.Generator().manual_seed(0)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the tracer's warnings on shape checks, one per Python branch
            converted = ov.convert_model(graph, example_input=torch.randn(2, C, H, W, generator=gen),
                                         input=[ov.PartialShape([-1, C, H, W])])  # batch dynamic, size fixed
    except Exception as e:  # noqa: BLE001 - the converter raises many kinds; say which ops failed
        raise ExportError(f"OpenVINO cannot convert this {model.family} model ({_conversion_failure(e)}): "
                          "run it with --backend torch or onnx") from None
    meta = {"family": model.family, "config": net.cfg.to_dict(), "preprocess": model.preprocess.to_dict(),
            "class_names": model.class_names, "provenance": model.provenance, "output": output,
            "num_features": int(getattr(net, "num_features", 0) or 0), "openvino": openvino_version()}
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.{os.getpid()}.", suffix=".tmp", dir=folder.parent))
    try:
        ov.save_model(converted, staging / IR_XML, compress_to_fp16=False)  # fp16 weights would break f32 parity
        (staging / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        runner = OpenVinoRunner(staging, precision="fp32")
        worst, shapes = 0.0, [(2, H, W), (3, H, W)]
        for b, h, w in shapes:
            x = torch.randn(b, C, h, w, generator=gen)
            with torch.no_grad():
                expect = graph(x)
            worst = max(worst, float((runner(x) - expect).abs().max()))
        if not worst <= tol:
            raise ExportError(f"{folder}: OpenVINO {output} differ from PyTorch by {worst:.2e} (tolerance {tol:.0e}): "
                              "run this model with --backend torch or onnx")
        _replace_folder(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {"path": str(folder), "max_abs_diff": worst, "checked_shapes": [list(s) for s in shapes],
            "openvino": meta["openvino"], "output": output}


def _conversion_failure(error: Exception) -> str:
    """The operations OpenVINO's report names (`-- No conversion rule found for operations: aten::op, ...`),
    else the error's first line."""
    ops = sorted(set(re.findall(r"\b(?:aten|prim|prims)::\w+", str(error))))
    if ops:
        return "no conversion for " + ", ".join(ops[:5])
    lines = [line.strip() for line in str(error).splitlines()]
    return f"{type(error).__name__}: {(lines or [''])[0][:160]}"


def _replace_folder(staging: Path, folder: Path) -> None:
    """Put the finished `staging` folder at `folder`: a rename, so readers see the old folder or the new one."""
    if folder.exists() and not (folder / META_FILE).is_file() and any(folder.iterdir()):
        raise ExportError(f"{folder} exists and is not a vitkit OpenVINO folder: give an empty or new folder")
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.{os.getpid()}.old")
        os.replace(folder, old)
    os.replace(staging, folder)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def is_ir_folder(path: str | os.PathLike) -> bool:
    """A folder meant as an OpenVINO IR (it has any of the IR's files): what `--backend openvino` reads as is."""
    path = Path(path)
    return path.is_dir() and any((path / name).exists() for name in IR_FILES)


def read_meta(folder: Path) -> dict[str, Any]:
    """The folder's vitkit.json after checking every IR file is there; one ExportError naming what to do."""
    missing = [name for name in IR_FILES if not (folder / name).is_file()]
    if missing:
        raise ExportError(f"{folder}: the OpenVINO folder lacks {', '.join(missing)}: write it again with "
                          "`vitkit export CKPT --openvino DIR`")
    try:
        meta = json.loads((folder / META_FILE).read_text())
        if not isinstance(meta, dict):
            raise ValueError("not an object")
    except (OSError, ValueError) as e:
        raise ExportError(f"{folder / META_FILE}: unreadable ({e}): write the folder again with "
                          "`vitkit export CKPT --openvino DIR`") from None
    return meta


class OpenVinoRunner(InferenceOnly):
    """An OpenVINO IR folder compiled for the CPU, usable where predict/eval expect a model.

    `runner(images)` takes [B, C, H, W] as a numpy array or torch tensor and returns the logits [B, K] (or
    the pooled features [B, D] of a features folder) in the same kind. `preprocess`, `class_names`,
    `num_classes`, `cfg` and `provenance` come from vitkit.json."""

    untrainable = "an OpenVINO model cannot be trained"
    train_error = ExportError

    def __init__(self, folder: str | os.PathLike, precision: str = "fp32", threads: int | None = None,
                 streams: int = 1, batch_size: int | None = None):
        """`batch_size`: the batch the runner is built for. Its graph (each stream's slice of it) is compiled with
        that batch fixed; any other batch size runs the batch-dynamic graph, compiled when first needed. None:
        batch-dynamic only. Fixed shapes let OpenVINO pick its kernels and buffers once: on a 2-core Zen 5,
        ViT-S/16 and B/16 at batch 1 and 8, fp32 and bf16, the runner so built ran 1.00-1.04x OpenVINO called
        directly, the batch-dynamic one 0.98-1.01x (benchmarks/openvino_runner.py, BENCHMARKS.md). Each compiled
        graph holds its own copy of the weights."""
        import_openvino()  # missing: the one line naming the extra comes before any other check
        threads = int(threads or torch.get_num_threads())
        if not 1 <= streams <= threads:
            raise ConfigError(f"OpenVINO streams must be between 1 and the thread count ({threads}), got {streams}")
        if batch_size is not None and batch_size < 1:
            raise ConfigError(f"batch_size must be a positive number of images, got {batch_size}")
        self.path = Path(folder)
        if not self.path.is_dir():
            raise ExportError(f"{self.path}: no such OpenVINO folder (write one with `vitkit export CKPT --openvino DIR`)")
        self.meta = meta = read_meta(self.path)
        self.precision = check_precision(precision)
        # one stream (the LATENCY hint) runs a batch on all threads; several streams (THROUGHPUT) each run a slice
        # of the batch on their share of the threads, with no synchronisation between them: at batch 8 on a 2-core
        # Xeon with AMX, 2 streams measured 1.01-1.05x OpenVINO's LATENCY form (benchmarks/openvino_runner.py)
        self.streams = streams
        self._config = {"INFERENCE_PRECISION_HINT": INFERENCE_PRECISION[precision], "INFERENCE_NUM_THREADS": threads}
        self._config |= {"PERFORMANCE_HINT": "LATENCY"} if streams == 1 else {"PERFORMANCE_HINT": "THROUGHPUT",
                                                                                "NUM_STREAMS": streams}
        self._graph = self._read(lambda: shared_core().read_model(self.path / IR_XML))
        # the slice sizes of a `batch_size` batch (5 across 2 streams: 3 and 2) get fixed-shape graphs
        self.static_sizes = sorted({len(part) for part in self._split(range(batch_size))}) if batch_size else []
        self._requests: dict[int | None, list] = {}  # batch size (None: dynamic) -> one infer request a stream
        for size in self.static_sizes or [None]:
            self._requests_for(size)  # compiled now: an IR this OpenVINO cannot load fails here, not mid-run
        family = get_family(meta.get("family", "vit"))
        self.cfg = family.config.from_dict(meta["config"]) if "config" in meta else None
        self.preprocess = Preprocess.from_dict(meta["preprocess"]) if meta.get("preprocess") else None
        self.class_names = meta.get("class_names")
        self.provenance = dict(meta.get("provenance") or {})
        self.output = meta.get("output", "logits")
        self.num_features = int(meta.get("num_features") or 0)
        self.num_classes = getattr(self.cfg, "num_classes", None) or self._graph.outputs[0].partial_shape[-1].get_length()
        # [C, H, W] of one image: OpenVINO itself answered a batch of the wrong channel count with an empty output
        self.image_shape = tuple(d.get_length() if d.is_static else None
                                 for d in self._graph.inputs[0].partial_shape[1:])

    def _read(self, load):
        """`load()`, with OpenVINO's untyped errors as one ExportError naming what to do."""
        try:
            return load()
        except Exception as e:  # noqa: BLE001 - OpenVINO raises its own untyped errors
            written = self.meta.get("openvino")
            which = (f"written by OpenVINO {written}, this is {openvino_version()}"
                     if written and written != openvino_version() else f"OpenVINO {openvino_version()}")
            first = (str(e).strip().splitlines() or [""])[0][:160]
            raise ExportError(f"{self.path}: OpenVINO cannot load this IR ({which}: {first}): write it again with "
                              "`vitkit export CKPT --openvino DIR`") from None

    def _split(self, batch):
        """`batch` cut along its first axis into one slice a stream, in order (fewer where it has fewer items)."""
        return np.array_split(batch, max(1, min(self.streams, len(batch))))

    def _requests_for(self, size: int | None) -> list:
        """One infer request a stream on the graph compiled for batches of `size` (None: any batch size)."""
        if size not in self._requests:
            def compile_():
                graph = self._graph
                if size is not None:
                    graph = graph.clone()  # reshape changes the graph in place: the dynamic one stays as read
                    graph.reshape([size, *graph.inputs[0].partial_shape[1:]])  # [size, C, H, W]
                return shared_core().compile_model(graph, "CPU", self._config)

            compiled = self._read(compile_)
            self._requests[size] = [compiled.create_infer_request() for _ in range(self.streams)]
        return self._requests[size]

    def __call__(self, images):
        as_tensor = isinstance(images, torch.Tensor)
        x = images.detach().float().cpu().numpy() if as_tensor else np.asarray(images, dtype=np.float32)
        if x.ndim != 4 or any(want is not None and got != want for got, want in zip(x.shape[1:], self.image_shape)):
            want = ", ".join("?" if d is None else str(d) for d in self.image_shape)
            raise ConfigError(f"{self.path}: this OpenVINO model takes batches [B, {want}], got "
                              f"{list(x.shape)}: preprocess the images as its vitkit.json says")
        # [b_i, C, H, W] each, in order; OpenVINO reads them in place (share_inputs): they live until the results
        slices = [np.ascontiguousarray(part) for part in self._split(x)]
        # slice i runs on request i of its graph's (one a stream): slices on the same graph never share one
        busy = [self._requests_for(len(part) if len(part) in self.static_sizes else None)[i]
                for i, part in enumerate(slices)]
        if len(busy) == 1:
            out = np.array(busy[0].infer([slices[0]], share_inputs=True)[0], copy=True)  # the request reuses its buffer
        else:
            for request, part in zip(busy, slices):
                request.start_async([part], share_inputs=True)
            for request in busy:
                request.wait()
            out = np.concatenate([np.array(request.get_output_tensor(0).data, copy=True) for request in busy])
        return torch.from_numpy(out) if as_tensor else out


def model_digest(model: nn.Module) -> str:
    """A content hash of the model: family, config, preprocessing, class names and every tensor of its state;
    the cache key of its converted IR (another checkpoint, or the same one changed, converts again)."""
    h = hashlib.sha256()
    h.update(json.dumps([model.family, model.cfg.to_dict(), model.preprocess.to_dict(), model.class_names],
                        sort_keys=True, default=str).encode())
    for name, tensor in model.state_dict().items():
        h.update(name.encode())
        h.update(str(tuple(tensor.shape)).encode() + str(tensor.dtype).encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:24]


def cache_folder() -> Path:
    """Where converted IR folders are kept: beside vitkit's other caches ($VITKIT_CACHE, ~/.cache/vitkit)."""
    from ..hardware import cache_file

    return cache_file().parent / "openvino"


def converted(model: nn.Module, output: str = "logits") -> Path:
    """The IR folder of `model`, converted on first use and cached by content hash and OpenVINO version."""
    folder = cache_folder() / f"{model_digest(model)}-{output}-ov{openvino_version()}"
    if not all((folder / name).is_file() for name in IR_FILES):
        from ..weights.notes import note_once

        note_once(f"converting the model to OpenVINO once (cached in {folder})")
        export_openvino(model, folder, output=output)
    return folder
