"""Patch size on any checkpoint (FlexiViT's pseudo-inverse resize): the kernel resample against timm's, the whole
model against timm's at the new patch size, resizing always from the original kernel, and the refusals."""
from __future__ import annotations

import pytest
import torch
from timm.layers import resample_patch_embed as timm_resample_patch_embed

import vitkit
from vitkit.errors import ConfigError
from vitkit.layers.patch_embed import resample_patch_kernel
from vitkit.peers import timm_twin


@pytest.mark.parametrize("old,new", [((16, 16), (8, 8)), ((8, 8), (16, 16)), ((16, 16), (12, 12)),
                                     ((14, 14), (32, 32)), ((4, 4), (7, 7)), ((16, 16), (10, 14))])
@pytest.mark.parametrize("interpolation", ["bicubic", "bilinear"])
def test_kernel_resample_equals_timm(old, new, interpolation):
    kernel = torch.randn(24, 3, *old, generator=torch.Generator().manual_seed(sum(old) + sum(new)))
    ours = resample_patch_kernel(kernel, new, interpolation=interpolation)
    theirs = timm_resample_patch_embed(kernel, list(new), interpolation=interpolation, antialias=True)
    assert ours.shape == (24, 3, *new)
    assert torch.allclose(ours, theirs, atol=1e-5), (ours - theirs).abs().max()


def test_resampled_kernel_sees_a_resized_patch_as_the_original_saw_the_patch():
    """What the pseudo-inverse is for: <resize(x), w'> = <x, w> for an upsampled kernel (exact: B^T B is invertible)."""
    kernel = torch.randn(5, 1, 8, 8)
    patch = torch.randn(1, 1, 8, 8)
    bigger = torch.nn.functional.interpolate(patch, size=(16, 16), mode="bicubic", antialias=True, align_corners=False)
    new = resample_patch_kernel(kernel, (16, 16))
    assert torch.allclose((bigger * new).sum((1, 2, 3)), (patch * kernel).sum((1, 2, 3)), atol=1e-4)


def _small_vit(**kw):
    torch.manual_seed(0)
    return vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=2, **kw).eval()


def test_set_input_size_patch_equals_timm_at_that_patch_size():
    model = _small_vit()
    twin = timm_twin(model).eval()
    x = torch.randn(2, 3, 64, 64)
    model.set_input_size(patch_size=8)
    twin.set_input_size(patch_size=8)
    assert model.patch_embed.grid_size == (8, 8) and model.cfg.patch_size == 8
    assert model.pos_embed.shape == twin.pos_embed.shape == (1, 1 + 64, 192)
    assert model.provenance["patch_resampled_from"] == 16
    with torch.no_grad():
        assert torch.allclose(model(x), twin(x), atol=1e-5)
    model.set_input_size(img_size=96, patch_size=12)  # both knobs at once: 8x8 patches of 12 px
    assert model.patch_embed.grid_size == (8, 8) and model.preprocess.input_size == (3, 96, 96)
    assert model(torch.randn(1, 3, 96, 96)).shape == (1, 1000)


def test_load_model_with_patch_size_equals_timm_at_that_patch_size(tmp_path):
    model = _small_vit()
    path = vitkit.save_model(model, tmp_path / "m.safetensors")
    twin = timm_twin(model).eval()
    twin.set_input_size(patch_size=8)
    loaded = vitkit.load_model(path, patch_size=8).eval()
    created = vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=2, checkpoint_path=path,
                                  patch_size=8).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = twin(x)
        assert torch.allclose(loaded(x), want, atol=1e-5)
        assert torch.allclose(created(x), want, atol=1e-5)


def test_resizing_twice_gives_back_the_original_model_exactly(tmp_path):
    model = _small_vit()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    model.set_input_size(patch_size=8)
    model.set_input_size(patch_size=4)
    model.set_input_size(patch_size=16)
    assert model.state_dict().keys() == original.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in original.items())
    assert "patch_resampled_from" not in model.provenance
    # a model loaded at patch 8 keeps the file's kernel and table as its originals
    path = vitkit.save_model(model, tmp_path / "m.safetensors")
    back = vitkit.load_model(path, patch_size=8)
    back.set_input_size(patch_size=16)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in original.items())


def test_a_kernel_trained_at_the_new_size_is_the_one_resized_next():
    model = _small_vit()
    model.set_input_size(patch_size=8)
    with torch.no_grad():  # as an optimizer step would: the 8x8 kernel is now the model's own
        model.patch_embed.proj.weight.add_(0.01)
        model.pos_embed.add_(0.01)
    trained_kernel, trained_pos = model.patch_embed.proj.weight.clone(), model.pos_embed.clone()
    model.set_input_size(patch_size=16)
    assert torch.equal(model.patch_embed.proj.weight, resample_patch_kernel(trained_kernel, (16, 16)))
    model.set_input_size(patch_size=8)
    assert torch.equal(model.patch_embed.proj.weight, trained_kernel)
    assert torch.equal(model.pos_embed, trained_pos)


def test_a_patch_size_the_image_does_not_divide_is_one_line_naming_the_valid_ones(tmp_path):
    model = _small_vit()
    with pytest.raises(ConfigError, match=r"not divisible by patch size 12.*1, 2, 4, 8, 16, 32, 64") as err:
        model.set_input_size(patch_size=12)
    assert "\n" not in str(err.value)
    assert model.cfg.patch_size == 16 and model.patch_embed.proj.weight.shape[-1] == 16  # unchanged
    path = vitkit.save_model(model, tmp_path / "m.safetensors")
    with pytest.raises(ConfigError, match=r"not divisible by patch size 12.*1, 2, 4, 8, 16, 32, 64"):
        vitkit.load_model(path, patch_size=12)


def test_families_without_a_resizable_patch_refuse_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="resnet.*no patch") as err:
        vitkit.create_model("resnet18", patch_size=8)
    assert "\n" not in str(err.value)
    resnet = vitkit.create_model("resnet18", num_classes=3)
    with pytest.raises(ConfigError, match="resnet.*no patch"):
        vitkit.load_model(vitkit.save_model(resnet, tmp_path / "r.safetensors"), patch_size=8)
    swin = vitkit.create_model("swin_tiny_patch4_window7_224", depths=(1, 1, 1, 1), embed_dim=24, num_classes=3)
    with pytest.raises(ConfigError, match="swin.*patch size"):
        vitkit.load_model(vitkit.save_model(swin, tmp_path / "s.safetensors"), patch_size=8)
    hybrid = vitkit.create_model("vit_tiny_r_s16_p8_224", img_size=64, depth=1)
    with pytest.raises(ConfigError, match="CNN stem"):
        hybrid.set_input_size(patch_size=16)
    with pytest.raises(ConfigError, match="CNN stem.*load it at its own patch size"):
        vitkit.load_model(vitkit.save_model(hybrid, tmp_path / "h.safetensors"), patch_size=16)


# ------------------------------------------------------------------------------------------- the commands
def test_train_finetune_at_another_patch_size_starts_from_the_resampled_kernel(tmp_path):
    """`vitkit train --finetune CKPT --patch-size P` as the trainer builds its model (the training loop itself is
    the same at any patch size, and slow on 2 cores: test_train.py runs it)."""
    from vitkit.cli.main import build_parser
    from vitkit.cli.train import resolve_recipe
    from vitkit.training.models import build

    torch.manual_seed(0)
    src = vitkit.create_model("vit_tiny_patch16_224", img_size=16, patch_size=4, depth=1, num_classes=5)
    ckpt = vitkit.save_model(src, tmp_path / "src.safetensors")
    args = build_parser().parse_args(["train", "--finetune", str(ckpt), "--data", "digits", "--patch-size", "2"])
    recipe, finetune = resolve_recipe(args)
    assert recipe.model_args["patch_size"] == 2
    model = build(recipe, 10, 1, (8, 8), finetune)
    assert model.cfg.patch_size == 2 and model.patch_embed.grid_size == (8, 8)
    assert model.pos_embed.shape == (1, 1 + 64, 192)
    assert torch.equal(model.patch_embed.proj.weight, resample_patch_kernel(src.patch_embed.proj.weight, (2, 2)))
    bad = build_parser().parse_args(["train", "--finetune", str(ckpt), "--data", "digits", "--patch-size", "3"])
    with pytest.raises(ConfigError, match="patch sizes that divide it: 1, 2, 4, 8, 16"):
        build(resolve_recipe(bad)[0], 10, 1, (8, 8), finetune)


def test_serve_at_another_patch_size_answers_as_the_resampled_model(tmp_path, monkeypatch, capsys):
    """The server's app is the real one, driven in-process (uvicorn.run only takes it instead of opening a port)."""
    import socket

    import numpy as np
    import uvicorn
    from fastapi.testclient import TestClient
    from PIL import Image

    from vitkit.cli.main import main as cli
    from vitkit.inference import predict_files

    apps = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: apps.append(app))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli(["serve", "bundled:fashion-mnist", "--patch-size", "7", "--port", str(port)]) == 0
    image = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28), dtype=np.uint8)).save(image)
    want, _ = predict_files(vitkit.load_model("bundled:fashion-mnist", patch_size=7), [image], top_k=3)
    plain, _ = predict_files(vitkit.load_model("bundled:fashion-mnist"), [image], top_k=3)
    with TestClient(apps[0]) as client:
        got = client.post("/v1/predict?top_k=3", content=image.read_bytes(), headers={"content-type": "image/png"})
    assert got.status_code == 200, got.text
    probs = [t["prob"] for t in got.json()["top"]]
    assert max(abs(a - b["prob"]) for a, b in zip(probs, want[0]["top"])) <= 1e-6
    assert max(abs(a - b["prob"]) for a, b in zip(probs, plain[0]["top"])) > 1e-4  # it is another model
    capsys.readouterr()
    assert cli(["serve", "bundled:fashion-mnist", "--patch-size", "5", "--port", str(port)]) != 0
    err = capsys.readouterr().err.strip()
    assert "1, 2, 4, 7, 14, 28" in err and "\n" not in err and not apps[1:]


def test_predict_eval_and_export_at_another_patch_size(tmp_path, capsys):
    """`--patch-size` on predict, eval and export runs the resampled model; an exported model refuses it."""
    import json

    import numpy as np
    from PIL import Image

    from vitkit.cli.main import main as cli
    from vitkit.inference import predict_files

    image = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (28, 28), dtype=np.uint8)).save(image)
    want, _ = predict_files(vitkit.load_model("bundled:fashion-mnist", patch_size=7), [image], top_k=3)
    assert cli(["predict", "bundled:fashion-mnist", str(image), "--patch-size", "7", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    rows = got if isinstance(got, list) else got.get("predictions", got.get("images"))
    probs = [t["prob"] for t in rows[0]["top"]]
    assert max(abs(a - b["prob"]) for a, b in zip(probs, want[0]["top"])) <= 1e-6
    onnx = tmp_path / "p7.onnx"
    assert cli(["export", "bundled:fashion-mnist", "--onnx", str(onnx), "--patch-size", "7"]) == 0
    capsys.readouterr()
    assert cli(["predict", str(onnx), str(image), "--backend", "onnx", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out if isinstance(out, list) else out.get("predictions", out.get("images"))
    assert max(abs(t["prob"] - b["prob"]) for t, b in zip(rows[0]["top"], want[0]["top"])) <= 1e-4
    assert cli(["predict", str(onnx), str(image), "--backend", "onnx", "--patch-size", "4"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "patch size" in err[0]
