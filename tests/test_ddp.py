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


def test_segmentation_head_trains_under_ddp_as_in_one_process(tmp_path):
    """The task (backbone + segmentation head) is the one module DDP wraps, so the head's gradients are averaged
    with the backbone's: 2 processes follow the 1-process run (GroupNorm/LayerNorm only: no batch statistics)."""
    if not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    seg = ["--task", "segment", "--data", "canvas-digits", "--model", "vit_tiny_patch4_28", "--epochs", "1",
           "--set", "img_size=32", "--set", "in_chans=1", "--set", 'model_args={"depth": 1, "embed_dim": 24, '
           '"num_heads": 2}', "--set", "steps_per_epoch=3", "--set", "batch_size=16", "--set", "crop=none",
           "--set", "hflip=0", "--set", "bf16=false", "--set", "ema=false", "--set", "warmup_epochs=0",
           "--set", "drop_path_rate=0", "--set", "task.dim=16", "--set", "task.overlays=0",
           "--set", "task.dropout=0", "--set", "eval_batch_size=500", "--quiet"]
    _one_process_and_two_agree(seg, tmp_path, "segmentation_head.safetensors")


def _one_process_and_two_agree(args: list[str], tmp_path, head_file: str) -> None:
    """`vitkit train ARGS` in one process and under torchrun with 2: the same 3 step losses and task head."""
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(["train", "--out", str(one), *args, "--set", "threads=1"]) == 0
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "vitkit", "train", "--out", str(two), *args], env=dict(os.environ, OMP_NUM_THREADS="1"),
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    l1, l2 = _losses(one), _losses(two)
    assert len(l1) == len(l2) == 3 and l2 == pytest.approx(l1, rel=1e-4, abs=1e-5)
    heads = [load_file(str(run / head_file)) for run in (one, two)]
    assert heads[0].keys() == heads[1].keys()
    # AdamW turns a near-zero gradient into a near-unit step, and the coarsest level's GroupNorm sees a 1x1 map
    # at 32 px, so float noise moves a few weights by about one lr step (2e-3); heads trained apart would
    # differ by steps everywhere: the mean over the head tells
    diff = torch.cat([(heads[0][k] - heads[1][k]).abs().flatten() for k in heads[0]])
    assert diff.mean() <= 1e-4, diff.mean().item()


def test_detector_trains_under_ddp_as_in_one_process(tmp_path):
    """FCOS divides its losses by the foreground locations it matched; under torchrun each rank matches only
    its half of the batch, so the task divides by the mean count over the ranks instead: the 2-process losses
    and weights then follow the 1-process run on the same global batch (per-rank counts would not)."""
    if not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    det = ["--task", "detect", "--data", "canvas-digits-boxes", "--model", "vit_tiny_patch4_28", "--epochs", "1",
           *[a for kv in ("img_size=48", "in_chans=1", "model.depth=1", "model.embed_dim=24", "model.num_heads=2",
                          "steps_per_epoch=3", "batch_size=16", "crop=none", "hflip=0", "reprob=0", "bf16=false",
                          "ema=false", "warmup_epochs=0", "drop_path_rate=0", "task.dim=32", "eval_subset=16",
                          "eval_batch_size=200") for a in ("--set", kv)], "--quiet"]
    _one_process_and_two_agree(det, tmp_path, "detection_head.safetensors")


@pytest.mark.parametrize("argv, rc, said", [(["train", "--recipe", "no-such-recipe"], 2, "no-such-recipe"),
                                            (["models", "--json", "vit_base_patch16_224"], 0, "vit_base_patch16_224")])
def test_a_torchrun_worker_exits_with_its_code_and_output(argv, rc, said):
    # a worker (WORLD_SIZE > 1) leaves without finalizing the interpreter (cli/main.py says why): its exit code
    # and what it printed to a pipe still come out
    env = dict(os.environ, WORLD_SIZE="2", RANK="0", LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, "-m", "vitkit", *argv], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == rc, proc.stderr[-2000:]
    assert said in proc.stdout + proc.stderr
