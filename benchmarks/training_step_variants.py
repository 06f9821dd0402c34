"""Paired training-step timing of a recipe's variants (issue 22): python benchmarks/training_step_variants.py VARIANT...
(base: NCHW eager, cl: channels-last conv weights, clx: also the input, compile, cl+compile); RECIPE, BS, ROUNDS env.
The first variant is the reference of the ratios; each round times 8 steps of every variant in turn."""
import copy
import os
import statistics
import sys
import time

import torch

from vitkit.data.transforms import collate
from vitkit.hardware import set_conv_order
from vitkit.training.recipes import PRESETS
from vitkit.training.trainer import Trainer

torch.set_num_threads(2)
name = os.environ.get("RECIPE", "fashion-mnist-conv")
bs = int(os.environ.get("BS", "128"))
r = PRESETS[name].replace(batch_size=bs)
tr = Trainer(r, "/tmp/pair_run", quiet=True)
tr.setup()
ds = tr.train_set
batches = [collate(ds.__getitems__(list(range(i * bs, (i + 1) * bs)))) for i in range(8)]
variants = sys.argv[1:] or ["base", "compile"]
nets = {}
for v in variants:
    task = copy.deepcopy(tr.task)
    # the trainer's setup may have set channels-last already (its measured decision): each variant sets its own
    set_conv_order(task, "cl" in v.split("+") or "clx" in v.split("+"))
    if "compile" in v.split("+"):
        for m in task.modules():
            if hasattr(m, "forward_features"):
                m.compile()
                break
    opt = torch.optim.AdamW(task.parameters(), lr=1e-4, fused=True)
    nets[v] = (task, opt)

def step(v, b):
    task, opt = nets[v]
    x, y = b[0], b[1]
    if "clx" in v.split("+"):
        x = x.contiguous(memory_format=torch.channels_last)
    out = task((x, y) + tuple(b[2:]))
    out["loss"].backward()
    out["loss"].item()
    opt.step()
    opt.zero_grad(set_to_none=True)

for v in variants:
    t = time.perf_counter()
    for i in range(4):
        step(v, batches[i % 8])
    print(v, "warm", round(time.perf_counter() - t, 1), flush=True)
times = {v: [] for v in variants}
for rnd in range(int(os.environ.get("ROUNDS", "8"))):
    for v in variants:
        t = time.perf_counter()
        for i in range(8):
            step(v, batches[i])
        times[v].append((time.perf_counter() - t) / 8)
base = variants[0]
for v in variants:
    ratios = [a / b for a, b in zip(times[base], times[v])]
    print(f"{v:20s} step {statistics.median(times[v]):.4f} s  {bs/statistics.median(times[v]):.0f} img/s  vs {base} {statistics.median(ratios):.3f}x")
