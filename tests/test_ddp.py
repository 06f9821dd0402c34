"""DDP on CPU (gloo) through torchrun: 2 processes follow the 1-process loss trajectory at the same global
batch (a global batch is split across ranks; gradients are averaged)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from vitkit.cli.main import main as cli

pytestmark = pytest.mark.slow  # two extra interpreters; still part of `make test`

ARGS = ["--epochs", "2", "--set", "steps_per_epoch=4", "--set", "batch_size=32", "--set", "crop=none",
        "--set", "drop_path_rate=0", "--set", "bf16=false", "--set", "warmup_epochs=0.5", "--quiet"]


def _losses(run) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "steps.jsonl").read_text().splitlines()]


def test_two_processes_match_one(tmp_path):
    pytest.importorskip("torch.distributed")
    if not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(["train", "--out", str(one), *ARGS, "--set", "threads=1"]) == 0
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "vitkit", "train", "--out", str(two), *ARGS], env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    cfg = json.loads((two / "config.json").read_text())
    assert cfg["world_size"] == 2  # rank 0 wrote the run folder
    l1, l2 = _losses(one), _losses(two)
    assert len(l1) == len(l2) == 8
    assert l2 == pytest.approx(l1, rel=1e-4, abs=1e-5)
    a, b = load_file(str(one / "last.safetensors")), load_file(str(two / "last.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-3, atol=1e-4, msg=k)
