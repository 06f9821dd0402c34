"""Pretrained names in every command, files of the wrong kind named for what they are, conversion that keeps
(or says it guessed) the preprocessing, eval on the data a checkpoint was trained on, and CLI polish.

Published weights come from a local Hugging Face cache laid out as huggingface_hub lays it out (refs/main and
a snapshot), holding a timm ViT-Ti/16 built here with random weights; the hub itself is never contacted."""
from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from vitkit.cli.main import main
from vitkit.errors import CheckpointError, ConfigError
from vitkit.weights.labels import imagenet1k_class_names

NAME = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
REPO = f"timm/{NAME}"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """An HF hub cache holding REPO's model.safetensors: a timm ViT-Ti/16 with random weights. -> (cache, peer)"""
    import timm

    peer = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in peer.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    cache = tmp_path_factory.mktemp("hub")
    repo_dir = cache / ("models--" + REPO.replace("/", "--"))
    (repo_dir / "snapshots" / COMMIT).mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()},
              str(repo_dir / "snapshots" / COMMIT / "model.safetensors"))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(COMMIT)
    return cache, peer


@pytest.fixture
def hub(hub_cache, monkeypatch):
    from huggingface_hub import constants

    cache, peer = hub_cache
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return peer


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Two real photos (skimage's astronaut and coffee) as PNG and JPEG."""
    from PIL import Image
    from skimage import data

    d = tmp_path_factory.mktemp("photos")
    Image.fromarray(data.astronaut()).save(d / "astronaut.png")
    Image.fromarray(data.coffee()).save(d / "coffee.jpg")
    return d


# ---------------------------------------------------------------------------- pretrained names
def test_load_model_by_pretrained_name(hub, photo_batch):
    model = vitkit.load_model(NAME).eval()
    assert model.provenance["source"] == f"hub:{REPO}"
    assert model.class_names == imagenet1k_class_names() and model.class_names[:2] == ["tench", "goldfish"]
    assert model.preprocess.mean == (0.5, 0.5, 0.5) and model.preprocess.crop_pct == 0.9
    x = photo_batch(224)
    with torch.no_grad():
        assert (model(x) - hub(x)).abs().max().item() <= 1e-4
    bare = vitkit.load_model("vit_tiny_patch16_224")  # a bare name with published weights: its first tag
    assert bare.provenance["source"] == f"hub:{REPO}" and bare.class_names == model.class_names
    assert vitkit.api.checkpoint_family(NAME) == "vit"


def test_pretrained_name_errors_say_what_is_known():
    with pytest.raises(ConfigError, match="no pretrained tag 'bogus'; known: augreg_in21k_ft_in1k"):
        vitkit.load_model("vit_tiny_patch16_224.bogus")
    with pytest.raises(ConfigError, match="without published weights"):
        vitkit.load_model("vit_tiny_patch4_28")
    with pytest.raises(CheckpointError, match="no such file"):  # a missing file named like a model
        vitkit.load_model("vit_tiny_patch16_224.safetensors")


def test_predict_with_a_pretrained_name(hub, photos, capsys):
    rc, out, err = run_cli(capsys, "predict", NAME, photos / "astronaut.png", photos / "coffee.jpg", "--json")
    assert rc == 0, err
    preds = json.loads(out)["predictions"]
    names = imagenet1k_class_names()
    model = vitkit.load_model(NAME).eval()
    from vitkit.inference import predict_files

    ref, _ = predict_files(model, [photos / "astronaut.png", photos / "coffee.jpg"])
    assert [p["top"] for p in preds] == [p["top"] for p in ref]
    assert all(t["label"] == names[t["index"]] for p in preds for t in p["top"])


def test_convert_explain_and_eval_take_a_pretrained_name(hub, photos, tmp_path, capsys, photo_batch):
    rc, out, err = run_cli(capsys, "convert", NAME, tmp_path / "tiny.safetensors", "--json")
    assert rc == 0, err
    info = json.loads(out)
    assert info["preprocess"]["mean"] == [0.5, 0.5, 0.5] and info["classes"] == 1000
    saved = vitkit.load_model(tmp_path / "tiny.safetensors").eval()
    assert saved.class_names == imagenet1k_class_names() and saved.provenance["converted_from"] == NAME
    x = photo_batch(224)
    with torch.no_grad():
        assert (saved(x) - hub(x)).abs().max().item() <= 1e-4

    rc, out, err = run_cli(capsys, "explain", NAME, photos / "astronaut.png", "--out", tmp_path / "rollout.png",
                           "--json")
    assert rc == 0, err
    assert NAME in out and list(tmp_path.glob("rollout*.png"))  # the heat map of the hub model

    # eval on a folder whose classes are ImageNet classes: labels map onto the 1000-way head
    from PIL import Image
    from skimage import data

    for cls, img in (("tench", data.astronaut()), ("goldfish", data.coffee())):
        (tmp_path / "data" / cls).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(img).rotate(90 * i).save(tmp_path / "data" / cls / f"{i}.png")
    rc, out, err = run_cli(capsys, "eval", NAME, "--data", tmp_path / "data", "--split", "all", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["count"] == 4 and len(res["class_names"]) == 1000


def test_finetune_from_a_pretrained_name(hub):
    """`vitkit train --finetune NAME` builds its model through training.models.build."""
    from vitkit.training.models import build
    from vitkit.training.recipes import get_recipe

    model = build(get_recipe("finetune").replace(img_size=32), num_classes=10, data_channels=3, data_size=(32, 32),
                  finetune=NAME)
    assert model.num_classes == 10 and model.cfg.img_size == (32, 32) and model.cfg.embed_dim == 192
    ref = vitkit.load_model(NAME)
    assert torch.equal(model.state_dict()["blocks.0.attn.qkv.weight"], ref.state_dict()["blocks.0.attn.qkv.weight"])


def test_offline_pretrained_name_fails_at_once_without_network(fresh_python, tmp_path, photos):
    """HF_HUB_OFFLINE=1 and an empty cache: one line, exit 2, and not one connection to the (local) endpoint."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    attempts = []

    def count():
        while True:
            try:
                conn, _ = srv.accept()
                attempts.append(conn)
            except TimeoutError:
                continue
            except OSError:
                return

    threading.Thread(target=count, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | dict(
        HF_HUB_CACHE=str(tmp_path / "empty"), HF_HOME=str(tmp_path / "home"), HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1", HF_ENDPOINT=f"http://127.0.0.1:{srv.getsockname()[1]}")
    try:
        start = time.monotonic()
        res = fresh_python.run(module="vitkit", args=["predict", NAME, str(photos / "astronaut.png")], env=env,
                               timeout=300)
        took = time.monotonic() - start
    finally:
        srv.close()
    assert res.returncode == 2 and res.stdout == "", res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vitkit predict: error:"), res.stderr
    assert "HF_HUB_OFFLINE" in lines[0] and REPO in lines[0] and "Retrying" not in res.stderr
    assert attempts == [], f"{len(attempts)} connection(s) to the hub endpoint in {took:.1f}s"


# ---------------------------------------------------------------------------- files of the wrong kind
def test_image_where_a_checkpoint_goes(photos, capsys):
    for photo in ("astronaut.png", "coffee.jpg"):
        rc, out, err = run_cli(capsys, "predict", photos / photo, photos / "astronaut.png")
        assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1
        assert f"{photos / photo} is an image, not a checkpoint" in err and "pickle" not in err


def test_onnx_file_picks_the_onnx_backend(tmp_path, photos, capsys, caplog):
    from vitkit.export.onnx import export_onnx

    model = vitkit.create_model("vit_pico_patch2_8", num_classes=4).eval()
    export_onnx(model, tmp_path / "m.onnx")
    rc, out, err = run_cli(capsys, "predict", tmp_path / "m.onnx", photos / "astronaut.png", "--json")
    assert rc == 0, err
    assert "is an ONNX model: running it with --backend onnx" in caplog.text
    rc2, out2, _ = run_cli(capsys, "predict", tmp_path / "m.onnx", photos / "astronaut.png", "--backend", "onnx",
                           "--json")
    assert rc2 == 0 and json.loads(out)["predictions"] == json.loads(out2)["predictions"]
    with pytest.raises(CheckpointError, match="is an ONNX model, not a checkpoint"):
        vitkit.load_model(tmp_path / "m.onnx")  # explain / export / analyze need the PyTorch checkpoint


def test_run_folder_resolves_to_its_best_checkpoint(tmp_path, photos, capsys, caplog):
    best, last = (vitkit.create_model("vit_pico_patch2_8", num_classes=4) for _ in range(2))
    vitkit.save_model(best, tmp_path / "best.safetensors")
    vitkit.save_model(last, tmp_path / "last.safetensors")
    loaded = vitkit.load_model(tmp_path)
    assert torch.equal(loaded.state_dict()["pos_embed"], best.state_dict()["pos_embed"])
    caplog.clear()
    rc, out, err = run_cli(capsys, "predict", tmp_path, photos / "astronaut.png")
    said = [r.getMessage() for r in caplog.records if "run folder" in r.getMessage()]
    assert rc == 0 and said == [f"{tmp_path} is a run folder: using {tmp_path / 'best.safetensors'}"]
    (tmp_path / "best.safetensors").unlink()  # a run stopped before its first best: the last one
    assert torch.equal(vitkit.load_model(tmp_path).state_dict()["pos_embed"], last.state_dict()["pos_embed"])


# ---------------------------------------------------------------------------- convert without --model
@pytest.fixture(scope="module")
def timm_tiny_file(tmp_path_factory):
    """A timm ViT-Ti/16 state dict (random weights): no metadata, the shape of ViT-Ti (augreg, 0.5) and DeiT-Ti."""
    import timm

    path = tmp_path_factory.mktemp("timm") / "vit_tiny.safetensors"
    peer = timm.create_model("vit_tiny_patch16_224", pretrained=False)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(path))
    return path


def test_convert_timm_file_keeps_augreg_preprocessing_and_says_it_guessed(timm_tiny_file, tmp_path, capsys, caplog):
    rc, out, err = run_cli(capsys, "convert", timm_tiny_file, tmp_path / "a.safetensors", "--json")
    assert rc == 0, err
    assert json.loads(out)["preprocess"]["mean"] == [0.5, 0.5, 0.5]
    assert vitkit.load_model(tmp_path / "a.safetensors").preprocess.std == (0.5, 0.5, 0.5)
    guessed = [r.getMessage() for r in caplog.records if "records no preprocessing" in r.getMessage()]
    assert len(guessed) == 1 and "--model deit_tiny_patch16_224" in guessed[0]
    rc, out, err = run_cli(capsys, "convert", timm_tiny_file, tmp_path / "d.safetensors", "--model",
                           "deit_tiny_patch16_224", "--json")
    assert rc == 0 and json.loads(out)["preprocess"]["mean"] == [0.485, 0.456, 0.406]
    rc, out, err = run_cli(capsys, "convert", timm_tiny_file, tmp_path / "m.safetensors", "--mean", "0.4,0.4,0.4",
                           "--std", "0.2", "--json")
    assert rc == 0 and json.loads(out)["preprocess"]["std"] == [0.2, 0.2, 0.2]
    assert vitkit.load_model(tmp_path / "m.safetensors").preprocess.mean == (0.4, 0.4, 0.4)


def test_head_count_warning_once_and_names_a_real_option(timm_tiny_file, tmp_path, photos, capsys, caplog):
    from vitkit.cli.main import build_parser

    for argv in (["predict", timm_tiny_file, photos / "astronaut.png"],
                 ["convert", timm_tiny_file, tmp_path / "out.safetensors"],
                 ["train", "--finetune", timm_tiny_file, "--list-recipes"]):
        run_cli(capsys, *argv)
    caplog.clear()
    rc, _, err = run_cli(capsys, "predict", timm_tiny_file, photos / "astronaut.png", photos / "coffee.jpg")
    lines = [r.getMessage() for r in caplog.records if "number of attention heads" in r.getMessage()]
    assert rc == 0 and len(lines) == 1, err
    assert f"vitkit convert {timm_tiny_file} OUT.safetensors --model NAME" in lines[0]
    convert = build_parser()._subparsers._group_actions[0].choices["convert"]
    assert "--model" in convert._option_string_actions
    # the caller who states the head count is not warned
    vitkit.weights.notes.reset()
    caplog.clear()
    vitkit.load_model(timm_tiny_file, num_heads=3)
    assert "attention heads" not in caplog.text


# ---------------------------------------------------------------------------- eval on the training data
def test_eval_without_data_uses_the_training_data_and_seed(tmp_path, capsys, caplog):
    from vitkit.data.datasets import load_data

    model = vitkit.create_model("vit_pico_patch2_8")
    vitkit.save_model(model, tmp_path / "digits.safetensors", class_names=[str(i) for i in range(10)], provenance={
        "recipe": "digits", "dataset": "digits", "command": "vitkit train --recipe digits --set seed=3 --out runs/x"})
    rc, out, err = run_cli(capsys, "eval", tmp_path / "digits.safetensors", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["data"] == "digits" and res["seed"] == 3 and res["count"] == len(load_data("digits", seed=3).test)
    vitkit.save_model(model, tmp_path / "plain.safetensors")  # records no data: digits, as before, but said
    rc, out, err = run_cli(capsys, "eval", tmp_path / "plain.safetensors", "--json")
    assert rc == 0 and json.loads(out)["data"] == "digits" and json.loads(out)["seed"] == 0
    assert "does not record the data it was trained on: evaluating on digits (pass --data" in caplog.text


def test_eval_split_val_reproduces_the_training_validation_split(tmp_path, capsys):
    """A run folder's config.json records the recipe (seed, val_fraction) and the held-out indices."""
    from vitkit.data.datasets import load_data

    run = tmp_path / "run"
    run.mkdir()
    model = vitkit.create_model("vit_pico_patch2_8")
    vitkit.save_model(model, run / "best.safetensors", class_names=[str(i) for i in range(10)],
                      provenance={"recipe": "digits", "dataset": "digits"})
    recipe = {"name": "digits", "data": "digits", "seed": 5, "val_fraction": 0.2}
    held = load_data("digits", seed=5, val_fraction=0.2)
    (run / "config.json").write_text(json.dumps({"recipe": recipe,
                                                 "data": {"split_indices": held.info["split_indices"]}}))
    rc, out, err = run_cli(capsys, "eval", run, "--split", "val", "--json")
    assert rc == 0, err
    res = json.loads(out)
    assert res["split"] == "val" and res["seed"] == 5 and res["count"] == len(held.info["split_indices"]["val_from_train"])


# ---------------------------------------------------------------------------- polish
def test_tables_fit_80_columns(monkeypatch, capsys, timm_tiny_file, tmp_path):
    monkeypatch.setenv("COLUMNS", "80")
    for argv in (["models"], ["models", "clip"], ["convert", timm_tiny_file, tmp_path / "o.safetensors"],
                 ["cost", "vit_large_patch14_clip_quickgelu_224"]):
        rc, out, err = run_cli(capsys, *argv)
        assert rc == 0, err
        wide = [ln for ln in out.splitlines() if len(ln) > 80]
        assert not wide, wide[:3]
    rc, out, _ = run_cli(capsys, "models", "vit_large")
    assert "vit_large_patch14_clip_quickgelu_224" in out and "1024/24/16" in out


def test_model_name_suggestions_rank_by_similarity():
    with pytest.raises(ConfigError) as e:
        vitkit.create_model("vit_bsae_patch16_224")
    assert "similar: vit_base_patch16_224," in str(e.value)
    with pytest.raises(ConfigError, match="similar: deit_small_patch16_224"):
        vitkit.create_model("deit_smal_patch16_224")


def test_bundled_model_arch_matches_its_shape():
    model = vitkit.load_model("bundled:fashion-mnist")
    prov = model.provenance
    assert prov["arch"] != "vit_tiny_patch4_28" and "128/4/4" in prov["arch"]
    rebuilt = vitkit.create_model(prov["base_arch"], **prov["model_args"])
    assert rebuilt.cfg == model.cfg


def test_the_command_line_starts_without_torch():
    """`vitkit --help` stays fast: building every subcommand's parser imports no heavy package."""
    import subprocess
    import sys

    code = ("import sys; from vitkit.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'numpy', 'PIL', 'rich', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    import vitkit

    assert vitkit.create_model is vitkit.api.create_model  # the lazy names are the real ones
