"""The convolutions' weight order for training (issue 22 item 1: decided by measurement on the machine that runs):
timed on the task's own training step in both orders, once per machine and model, cached; the timing leaves the
task as it found it; off where measuring is off (timm's NCHW); $VITKIT_FAST_PATHS forces it; a channels-last
run trains, saves and resumes like an NCHW one."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vitkit import hardware
from vitkit.data.transforms import collate
from vitkit.training import memory_format
from vitkit.training.recipes import Recipe
from vitkit.training.trainer import Trainer

# a conv-stem ViT (two 3x3 convs + a 2x2 patch conv) small enough for digits' 8x8 images
CONV_VIT = dict(data="digits", model="vit_tiny_conv_28", model_args={"depth": 1, "embed_dim": 16, "num_heads": 2},
                img_size=8, in_chans=1, epochs=1, steps_per_epoch=2, batch_size=8, threads=1, bf16=False, crop="none",
                hflip=0.0)


def _conv_weights(module) -> list[torch.Tensor]:
    return [m.weight for m in module.modules() if isinstance(m, torch.nn.Conv2d)]


def _is_channels_last(w: torch.Tensor) -> bool:
    return w.is_contiguous(memory_format=torch.channels_last)  # a 1-channel input conv's weight is both orders


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_MEASURE", "0")
    monkeypatch.delenv("VITKIT_FAST_PATHS", raising=False)
    t = Trainer(Recipe(**CONV_VIT), tmp_path / "run", quiet=True)
    t.setup()
    return t


def test_measuring_off_keeps_timms_order(trainer):
    assert not trainer.decisions.channels_last_training
    assert "measuring is off" in trainer.decisions.why["channels_last_training"]
    weights = _conv_weights(trainer.task)
    assert len(weights) == 3 and all(w.is_contiguous() for w in weights)
    assert not any(_is_channels_last(w) for w in weights if w.shape[1] > 1)


def test_timing_both_orders_leaves_the_task_as_it_found_it(trainer):
    task = trainer.task
    batch = collate([trainer.train_set[i] for i in range(8)])
    before = {k: v.clone() for k, v in task.state_dict().items()}
    rng = torch.get_rng_state()
    ratio = memory_format.time_orders(task, batch)
    assert ratio > 0
    after = task.state_dict()
    # BatchNorm's running statistics (and its counter) are what the timing passes would have moved
    assert any("running_mean" in k for k in before)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in task.parameters())
    assert all(w.is_contiguous() for w in _conv_weights(task))
    # the order changes the memory layout, not the function: the same loss in both orders
    task.eval()
    with torch.no_grad():
        nchw = task(batch)["loss"].item()
        hardware.set_conv_order(task, True)
        assert all(_is_channels_last(w) for w in _conv_weights(task))
        nhwc = task(batch)["loss"].item()
    assert nhwc == pytest.approx(nchw, rel=1e-5, abs=1e-6)


SETUP = r"""
import json, sys, torch
from vitkit.training.recipes import Recipe
from vitkit.training.trainer import Trainer
t = Trainer(Recipe(**json.loads(sys.argv[2])), sys.argv[1], quiet=True)
t.setup()
convs = [m.weight for m in t.task.modules() if isinstance(m, torch.nn.Conv2d)]
print(json.dumps({"on": t.decisions.channels_last_training, "why": t.decisions.why["channels_last_training"],
                  "nhwc": [w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
                           for w in convs if w.shape[1] > 1]}))
"""


def _setup(out, cache, **env) -> tuple[dict, str]:
    full = {k: v for k, v in os.environ.items() if k != "VITKIT_FAST_PATHS"}
    full |= {"VITKIT_CACHE": str(cache), "VITKIT_MEASURE": "1", "VITKIT_MEASURE_ROUNDS": "3", **env}
    proc = subprocess.run([sys.executable, "-c", SETUP, str(out), json.dumps(CONV_VIT)], env=full, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_measured_on_the_model_once_cached_and_followed(tmp_path):
    first, said = _setup(tmp_path / "a", tmp_path / "cache")
    assert said.count("timing this model's training step in both convolution orders once") == 1
    cache = json.loads((tmp_path / "cache" / "fast-paths.json").read_text())
    (key, entry), = [(k, v) for k, v in cache.items() if "| channels_last_training |" in k]
    assert key.startswith(hardware.machine_key(hardware.detect()).rsplit(" | ", 5)[0])  # this machine's entry
    assert entry["ratio"] > 0
    on = entry["ratio"] >= hardware.MEASURED_WIN
    assert first["on"] == on and first["nhwc"] == [on] * 2  # the two convs with more than one input channel
    assert f"{entry['ratio']:.2f}x NCHW" in first["why"] and "(cached)" not in first["why"]
    # a second process reads the cache: no timing, the same decision
    second, said = _setup(tmp_path / "b", tmp_path / "cache")
    assert "convolution orders" not in said and second["on"] == on and "(cached)" in second["why"]
    # another model (other shapes) is another entry
    third, said = _setup(tmp_path / "c", tmp_path / "cache", VITKIT_FAST_PATHS="channels_last_training=off")
    assert "convolution orders" not in said and not third["on"] and "VITKIT_FAST_PATHS" in third["why"]


def test_an_unwritable_or_corrupt_cache_measures_again_with_a_note(tmp_path, monkeypatch, capsys):
    calls = []

    def time_it():
        calls.append(1)
        return 1.25

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "fast-paths.json").write_text("{not json")
    monkeypatch.setenv("VITKIT_CACHE", str(corrupt))
    assert hardware.cached_model_ratio("channels_last_training", "sig-a", time_it) == (1.25, False)
    assert "| sig-a" in next(iter(json.loads((corrupt / "fast-paths.json").read_text())))  # replaced
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the cache "directory" is a file: nothing can be written under it
    monkeypatch.setenv("VITKIT_CACHE", str(blocked))
    assert hardware.cached_model_ratio("channels_last_training", "sig-b", time_it) == (1.25, False)
    assert "could not cache the measurement" in capsys.readouterr().err
    # the same process does not measure twice
    assert hardware.cached_model_ratio("channels_last_training", "sig-b", time_it) == (1.25, True)
    assert len(calls) == 2


def test_a_channels_last_run_trains_saves_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_MEASURE", "0")
    monkeypatch.setenv("VITKIT_FAST_PATHS", "channels_last_training=on")
    recipe = Recipe(**(CONV_VIT | {"epochs": 2}))
    t = Trainer(recipe, tmp_path / "run", quiet=True, stop_after_epochs=1)
    assert t.run()["status"] == "stopped"
    assert all(_is_channels_last(w) for w in _conv_weights(t.task))
    resumed = Trainer(recipe, tmp_path / "run", quiet=True, resume=True)
    summary = resumed.run()
    assert summary["status"] == "done" and summary["epochs"] == 2
    assert all(_is_channels_last(w) for w in _conv_weights(resumed.task))
    assert all(torch.isfinite(p).all() for p in resumed.task.parameters())
