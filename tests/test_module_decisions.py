"""Every module a run trains follows this machine's fast-path decisions, the task's own heads included (MAE's
decoder, DINO's head, the segmentation neck), not only the model: layers default to timm's path, and one
function (hardware.apply_fast_paths) sets the switches on the whole trainable module."""
from __future__ import annotations

import json
import os
import subprocess
import sys

SWITCHES = ("native_fastpath", "matmul_attention", "matmul_attention_training", "onednn", "onednn_training", "packed",
            "widened", "widened_training")

SCRIPT = r"""
import json, sys
from vitkit.training.recipes import Recipe
from vitkit.training.trainer import Trainer
tiny = {"depth": 1, "embed_dim": 16, "num_heads": 2}
common = dict(model="vit_pico_patch2_8", model_args=tiny, epochs=1, steps_per_epoch=1, batch_size=8, threads=1,
              bf16=False, crop="none", hflip=0.0)
runs = {
    "classification": dict(data="digits"),
    "mae": dict(data="digits", task="mae", task_args={"decoder_dim": 16, "decoder_depth": 1, "decoder_heads": 2}),
    "dino": dict(data="digits", task="dino", task_args={"out_dim": 8, "hidden_dim": 8, "bottleneck_dim": 4,
                                                        "n_local": 1}),
    "segment": dict(data="canvas-digits", task="segment", model="vit_tiny_patch4_28", img_size=32, in_chans=1,
                    task_args={"dim": 8}),
}
switches = json.loads(sys.argv[2])
out = {}
for name, kw in runs.items():
    t = Trainer(Recipe(**(common | kw)), sys.argv[1] + "/" + name, quiet=True)
    t.setup()
    found = {}
    for mname, m in t.task.named_modules():
        for s in switches:
            if isinstance(getattr(m, s, None), bool):
                found.setdefault(s, []).append([("model" if mname.startswith("model.") else "head"), getattr(m, s)])
    out[name] = found
print(json.dumps(out))
"""


def _switches(tmp_path, **env) -> dict:
    full = {k: v for k, v in os.environ.items() if k != "VITKIT_FAST_PATHS"} | env
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), json.dumps(SWITCHES)], env=full,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_trainable_module_has_a_fast_path_on_under_the_avx2_cap(tmp_path):
    got = _switches(tmp_path, ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", VITKIT_MEASURE="0")
    for task, found in got.items():
        assert found, task
        on = {s: [w for w, v in vals if v] for s, vals in found.items()}
        assert not any(on.values()), (task, on)
    # the heads were there to be checked: MAE's decoder blocks and the segmentation neck have switches
    assert any(w == "head" for vals in got["mae"].values() for w, _ in vals)


def test_forced_paths_reach_the_task_heads_too(tmp_path):
    """With every path forced on, every switch in the trainable module is on: the heads are not left at a
    layer default (the decisions are applied to the task, not only to the model)."""
    got = _switches(tmp_path, VITKIT_FAST_PATHS="native_encoder=on,matmul_attention=on,"
                                               "matmul_attention_training=on,onednn_linear=on,"
                                               "onednn_linear_training=on,packed_linear=on,"
                                               "widened_bf16=on,widened_bf16_training=on")
    for task, found in got.items():
        off = {s: [w for w, v in vals if not v] for s, vals in found.items()}
        assert not any(off.values()), (task, off)
    assert any(w == "head" for vals in got["mae"].values() for w, _ in vals)
