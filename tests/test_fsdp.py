"""FSDP (FSDP2 `fully_shard`) on CPU with gloo: `vitkit train --strategy fsdp` in 2 processes under torchrun
against one process on the same global batch: the gradients and AdamW-updated weights of a step (from the
gathered training state), then a resume under FSDP (losses, full checkpoints that `vitkit.load_model` reads)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import vitkit
from vitkit.cli.main import main as cli
from vitkit.training.state import load_state

pytestmark = pytest.mark.slow  # extra interpreters; still part of `make test`

# a tiny ViT, 2 epochs of 1 step each; no gradient clipping, which could hide gradients twice too large
ARGS = ["--epochs", "2", "--set", "steps_per_epoch=1", "--set", "batch_size=32", "--set", "crop=none",
        "--set", "drop_path_rate=0", "--set", "bf16=false", "--set", "warmup_epochs=0", "--set", "ema=false",
        "--set", "clip_grad=none", "--quiet"]
BETA1 = 0.9  # the recipe's AdamW betas[0]: after one step exp_avg = (1 - beta1) * gradient


def _torchrun(*args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           *args], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(autouse=True)
def _gloo():
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")


def test_fsdp_matches_one_process_and_resumes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert cli(["train", "--out", str(one), *ARGS, "--set", "threads=1", "--stop-after-epochs", "1"]) == 0
    _torchrun("-m", "vitkit", "train", "--strategy", "fsdp", "--out", str(two), *ARGS, "--stop-after-epochs", "1")
    assert not (two / "summary.json").exists()

    # after step 1, on the same global batch: the gradients (AdamW's first moment over 1 - beta1), the updated
    # weights and the second moment, gathered whole and numbered like a one-process optimizer's
    s1, s2 = load_state(one / "state.safetensors"), load_state(two / "state.safetensors")
    o1, o2 = s1["optimizer"], s2["optimizer"]
    assert o1["state"].keys() == o2["state"].keys()
    names = {i: n for g in o1["param_groups"] for i, n in zip(g["params"], g["names"])}
    real_grad = {}
    for i, st in o1["state"].items():
        grad, got = st["exp_avg"] / (1 - BETA1), o2["state"][i]["exp_avg"] / (1 - BETA1)
        torch.testing.assert_close(got, grad, rtol=1e-4, atol=1e-6, msg=lambda m, i=i: f"{names[i]}: {m}")
        torch.testing.assert_close(o2["state"][i]["exp_avg_sq"], st["exp_avg_sq"], rtol=1e-3, atol=1e-12)
        # Adam's first step is about lr * sign(gradient): where a gradient is float noise (k's bias under
        # softmax, a dead GELU unit) the sign is noise too, so weights are compared where the gradient is real
        real = real_grad[names[i]] = grad.abs() > 1e-6
        assert real.float().mean() > 0.5 or grad.numel() < 100, names[i]
        w1, w2 = s1["model"][names[i]], s2["model"][names[i]]
        torch.testing.assert_close(w2[real], w1[real], rtol=1e-5, atol=1e-6, msg=lambda m, i=i: f"{names[i]}: {m}")

    # resumed under FSDP, the second step lands where one process's does
    assert cli(["train", "--out", str(one), "--resume", "--quiet"]) == 0
    _torchrun("-m", "vitkit", "train", "--strategy", "fsdp", "--out", str(two), "--resume", "--quiet")
    summary = json.loads((two / "summary.json").read_text())
    assert summary["status"] == "done" and summary["world_size"] == 2 and summary["strategy"] == "fsdp"
    losses = [[json.loads(line)["loss"] for line in (run / "steps.jsonl").read_text().splitlines()] for run in (one, two)]
    assert len(losses[0]) == len(losses[1]) == 2
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    ref, got = vitkit.load_model(one / "last.safetensors"), vitkit.load_model(two / "last.safetensors")  # full checkpoints
    for (name, a), b in zip(ref.state_dict().items(), got.state_dict().values()):
        real = real_grad.get(name, torch.ones_like(a, dtype=torch.bool))  # buffers: all
        torch.testing.assert_close(b[real], a[real], rtol=1e-4, atol=1e-5, msg=name)


def test_fsdp_refuses_what_it_does_not_shard_yet(capsys):
    from vitkit.training.fsdp import check_recipe
    from vitkit.training.recipes import get_recipe

    with pytest.raises(vitkit.errors.ConfigError, match="ema=True"):
        check_recipe(get_recipe("digits"))  # EMA on
    with pytest.raises(vitkit.errors.ConfigError, match="task=mae"):
        check_recipe(get_recipe("digits").replace(ema=False, task="mae"))
    check_recipe(get_recipe("digits").replace(ema=False))  # classification without EMA: sharded
    with pytest.raises(SystemExit) as exit_:
        cli(["train", "--strategy", "sharded"])
    assert exit_.value.code == 2 and "invalid choice: 'sharded'" in capsys.readouterr().err
