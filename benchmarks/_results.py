"""The results file pair the small benchmark scripts write: benchmarks/results/STEM.md (a command line, then the
table) and STEM.json (command, date, machine, rows). Imported by the scripts as a sibling module."""
from __future__ import annotations

import json
import platform
from datetime import datetime, timezone
from pathlib import Path

import torch

from vitkit.hardware import Capabilities

RESULTS = Path(__file__).resolve().parent / "results"


def write_results(stem: str, command: str, caps: Capabilities, table: list[str], rows: list[dict]) -> str:
    """Write both files and return the Markdown (the table under its command, date and machine)."""
    machine = dict(cpu=caps.cpu, cores=caps.cores, threads=torch.get_num_threads(), native_bf16=caps.native_bf16,
                   torch=torch.__version__, python=platform.python_version())
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([f"Command: `{command}` ({date}; {machine['cpu']}, {machine['cores']} cores, "
                      f"{machine['threads']} threads, torch {machine['torch']})", "", *table]) + "\n"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.md").write_text(text)
    (RESULTS / f"{stem}.json").write_text(json.dumps({"command": command, "date": date, "machine": machine,
                                                      "rows": rows}, indent=2) + "\n")
    return text
