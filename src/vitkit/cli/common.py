"""Helpers shared by subcommands: JSON-or-table output and argument types with clear errors."""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any


def add_json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                justify: Sequence[str] | None = None) -> None:
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for i, col in enumerate(columns):
        table.add_column(col, justify=(justify[i] if justify else ("left" if i == 0 else "right")), overflow="fold")
    for row in rows:
        table.add_row(*[str(c) for c in row])
    console().print(table)


def console():
    """A rich console as wide as the terminal (COLUMNS when set; 80 when not a terminal): tables fold long
    cells onto more lines rather than run past the edge."""
    from rich.console import Console

    return Console()


def emit(args: argparse.Namespace, data: Any, render: Callable[[Any], None]) -> None:
    """JSON when --json was asked for, else the human rendering."""
    if getattr(args, "json", False):
        print_json(data)
    else:
        render(data)


def add_data_options(p: argparse.ArgumentParser, default_note: str = "") -> None:
    """`--set data.KEY=VALUE` (repeatable): the data source's own settings, as `vitkit train --set data.*` takes
    them (shards: data.label_key; Hugging Face datasets: data.image_key, data.label_key, data.streaming)."""
    p.add_argument("--set", dest="data_options", action="append", default=[], metavar="data.KEY=VALUE",
                   help="a data source setting, e.g. data.label_key=json (repeatable)" + default_note)


def data_options(args: argparse.Namespace) -> dict[str, str] | None:
    """The `--set data.KEY=VALUE` settings as {KEY: VALUE}, None when none were given."""
    from ..errors import ConfigError

    out: dict[str, str] = {}
    for item in getattr(args, "data_options", None) or []:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key.startswith("data.") or len(key) == 5:
            raise ConfigError(f"--set takes data.KEY=VALUE here (a data source setting), got {item!r}")
        out[key[5:].replace("-", "_")] = value.strip()
    return out or None


def _whole_number(text: str, least: int, need: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"must be {need}, got {v}")
    return v


def positive_int(text: str) -> int:
    return _whole_number(text, 1, "at least 1")


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0, "0 or more")


def non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return v


def img_size(text: str) -> int | tuple[int, int]:
    """'224' or '224x320' (height x width)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 224 or 224x320, got {text!r}") from None
    if len(parts) not in (1, 2) or any(p <= 0 for p in parts):
        raise argparse.ArgumentTypeError(f"expected a size like 224 or 224x320, got {text!r}")
    return parts[0] if len(parts) == 1 else (parts[0], parts[1])


def load_backend(checkpoint: str, backend: str = "torch", precision: str = "auto", batch_size: int | None = None):
    """A model to run: any checkpoint of any family through PyTorch (a file, a run folder, `bundled:NAME` or a
    pretrained `name.tag`), or an exported .onnx file through ONNX Runtime (same call interface,
    preprocessing and class names from its metadata). An .onnx file runs in ONNX Runtime whatever `backend`
    says, with a note. `openvino`: an IR folder, or a checkpoint converted on first use (`vitkit.runner`), its
    graph compiled for batches of `batch_size` where given (others run on the batch-dynamic graph)."""
    if backend == "openvino":
        from ..export.runner import runner

        return runner(checkpoint, backend="openvino", precision=precision, batch_size=batch_size)
    if backend != "onnx" and str(checkpoint).lower().endswith(".onnx"):
        from ..weights.notes import note_once

        note_once(f"{checkpoint} is an ONNX model: running it with --backend onnx")
        backend = "onnx"
    if backend == "onnx":
        from ..export.onnx import OnnxRunner

        return OnnxRunner(checkpoint)
    from ..api import load_model

    return load_model(checkpoint)
