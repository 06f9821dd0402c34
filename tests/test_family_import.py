"""Foreign checkpoints of another family: a timm Swin state dict and an original-repository (microsoft) Swin
checkpoint load with `load_model`, `create_model(checkpoint_path=)` and `vitkit convert` as a Swin, with the
architecture read off the shapes, and give timm's outputs; at another window the bias tables are resampled."""
from __future__ import annotations

import json

import pytest
import timm
import torch
from safetensors.torch import save_file

import vitkit
from test_import_timm import perturb
from test_swin import TOL, to_original_layout
from vitkit.api import checkpoint_family
from vitkit.cli.main import main
from vitkit.errors import CheckpointError
from vitkit.models.config import IMAGENET_MEAN, IMAGENET_STD
from vitkit.weights.convert import to_vitkit

# a reduced swin_tiny at 64 px, window 4: its last stage (2x2) is clamped to a 2x2 window
SMALL = dict(img_size=64, embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 4), window_size=4, num_classes=7)


@pytest.fixture(scope="module")
def timm_swin():
    return perturb(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **SMALL), seed=5)


def _save(sd: dict, path) -> str:
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    return str(path)


def _max_diff(a, b, x) -> float:
    with torch.no_grad():
        return (a(x) - b(x)).abs().max().item()


def test_timm_swin_file_loads_as_swin_with_the_shapes_config(tmp_path, timm_swin, photo_batch, record_parity):
    path = _save(timm_swin.state_dict(), tmp_path / "swin.safetensors")
    assert checkpoint_family(path) == "swin"
    model = vitkit.load_model(path)
    assert model.family == "swin" and model.provenance["imported_from"] == "timm-swin"
    cfg = model.cfg
    assert (cfg.img_size, cfg.embed_dim, cfg.depths, cfg.num_heads, cfg.window_size, cfg.num_classes) == \
        ((64, 64), 32, (1, 1, 2, 1), (2, 2, 4, 4), 4, 7)
    x = photo_batch(64, IMAGENET_MEAN, IMAGENET_STD)
    d = _max_diff(model.eval(), timm_swin, x)
    record_parity("swin timm file -> load_model (shapes config)", d, d)
    assert d <= TOL


def test_original_repo_checkpoint_loads_through_every_path(tmp_path, timm_swin, photo_batch, capsys):
    path = tmp_path / "swin_original.pth"
    torch.save(to_original_layout(timm_swin.state_dict(), timm_swin), path)
    x = photo_batch(64, IMAGENET_MEAN, IMAGENET_STD)
    loaded = vitkit.load_model(path)
    assert loaded.provenance["imported_from"] == "swin-original"
    assert _max_diff(loaded.eval(), timm_swin, x) <= TOL
    created = vitkit.create_model("swin_tiny_patch4_window7_224", checkpoint_path=path, img_size=64, window_size=4,
                                  embed_dim=32, depths=(1, 1, 2, 1), num_heads=(2, 2, 4, 4))
    assert created.num_classes == 7  # the head is read from `head.fc.weight`, not re-initialised
    assert _max_diff(created.eval(), timm_swin, x) <= TOL
    out = tmp_path / "converted.safetensors"
    assert main(["convert", str(path), str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "swin" and info["layout"] == "swin-original" and info["config"]["depths"] == [1, 1, 2, 1]
    assert _max_diff(vitkit.load_model(out).eval(), timm_swin, x) <= TOL


def test_full_size_shapes_give_the_registered_config_and_preprocessing(tmp_path):
    """swin_tiny's shapes (window 7, 4 stages) mean 224 px: the registered swin_tiny config, and a file with
    them gets that name and its preprocessing; other shapes get the family default with one line."""
    name = "swin_tiny_patch4_window7_224"
    with torch.device("meta"):
        sd = timm.create_model(name, pretrained=False).state_dict()
    imported = to_vitkit({"model": sd})
    assert imported.family == "swin" and imported.config.img_size == (224, 224)
    assert imported.config == vitkit.models.get_entry(name).cfg
    path = _save(timm.create_model(name, pretrained=False, num_classes=0).state_dict(), tmp_path / "t.safetensors")
    model = vitkit.load_model(path)
    assert model.provenance["arch"] == model.provenance["preprocess_from"] == name
    assert model.preprocess.crop_pct == 0.9 and model.preprocess.mean == IMAGENET_MEAN and model.num_classes == 0


def test_another_window_and_resolution_resample_the_bias_tables(tmp_path, timm_swin):
    path = _save(timm_swin.state_dict(), tmp_path / "swin.safetensors")
    model = vitkit.load_model(path, img_size=96, window_size=6)
    tables = [b.attn.relative_position_bias_table for s in model.layers for b in s.blocks]
    assert [t.shape[0] for t in tables] == [11 * 11] * 4 + [5 * 5]  # 24, 12, 6 px maps: window 6; 3 px: 3
    src = timm_swin.state_dict()["layers.0.blocks.0.attn.relative_position_bias_table"]  # window 4: 7x7 rows
    # the zero offset (the table's centre) falls on a grid point of both tables: bicubic keeps its value
    assert torch.allclose(tables[0][5 * 11 + 5], src[3 * 7 + 3], atol=1e-5)
    assert not torch.allclose(tables[0][0], src[0], atol=1e-5)  # the outermost offsets are resampled
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 96, 96))).all()


def test_a_vit_file_is_still_a_vit_and_bad_swin_files_fail_in_one_line(tmp_path, timm_swin):
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1, img_size=32, patch_size=8)
    path = _save(vit.state_dict(), tmp_path / "vit.safetensors")
    assert checkpoint_family(path) == "vit" and vitkit.load_model(path).family == "vit"
    sd = dict(timm_swin.state_dict())
    sd["layers.0.blocks.0.attn.relative_position_bias_table"] = torch.zeros(50, 2)  # not (2w-1)^2 rows
    with pytest.raises(CheckpointError, match="not \\(2w-1\\)\\^2"):
        vitkit.load_model(_save(sd, tmp_path / "bad.safetensors"))
    with pytest.raises(CheckpointError, match="holds a swin model"):
        vitkit.create_model("vit_tiny_patch16_224", checkpoint_path=_save(timm_swin.state_dict(), tmp_path / "s.st"))
