"""`vitkit convert` round trips for foreign layouts, and the errors a wrong file or --model gives."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer as TimmViT

import vitkit
from test_import_refusals_gone import big_vision_map_file, dinov2_giant_file
from test_import_timm import TINY, check, perturb, reference
from vitkit.cli.main import main
from vitkit.errors import CheckpointError
from vitkit.weights.importers.jax_npz import to_jax_arrays


def _convert(capsys, *argv):
    rc = main(["convert", *map(str, argv), "--json"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 else None), out.err


def test_convert_hf_folder_round_trip(tmp_path, capsys, photo_batch, record_parity):
    from transformers import ViTConfig, ViTForImageClassification

    peer = perturb(ViTForImageClassification(ViTConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                                       intermediate_size=512, image_size=32, patch_size=8,
                                                       num_labels=10)))
    peer.save_pretrained(tmp_path / "hf")
    rc, info, _ = _convert(capsys, tmp_path / "hf", tmp_path / "vit.safetensors")
    assert rc == 0 and info["layout"] == "hf-vit" and info["config"]["norm_eps"] == 1e-12
    x = photo_batch(32)
    with torch.no_grad():
        ref = peer(pixel_values=x).logits, peer.vit(pixel_values=x).last_hidden_state[:, 0]
    vk = vitkit.load_model(tmp_path / "vit.safetensors")  # vitkit's own file: config + preprocess travel along
    assert vk.provenance["converted_from"] == str(tmp_path / "hf") and vk.preprocess.interpolation == "bilinear"
    check(vk, x, ref, "vitkit convert HF folder -> vitkit -> load_model", record_parity)


def test_convert_npz_round_trip(tmp_path, capsys, photo_batch, record_parity):
    peer = perturb(TimmViT(**TINY, act_layer="gelu_tanh"))
    np.savez(tmp_path / "ViT-Ti_8.npz", **to_jax_arrays(peer.state_dict(), 2, "vit_jax"))
    rc, info, _ = _convert(capsys, tmp_path / "ViT-Ti_8.npz", tmp_path / "vit.safetensors")
    assert rc == 0 and info["layout"] == "vit_jax-npz" and info["config"]["act"] == "gelu_tanh"
    x = photo_batch(32)
    check(vitkit.load_model(tmp_path / "vit.safetensors"), x, reference(peer, x),
          "vitkit convert npz -> vitkit -> load_model", record_parity)


def test_unknown_layout_lists_known_layouts(tmp_path, capsys):
    path = tmp_path / "mystery.safetensors"
    save_file({"encoder.stem.weight": torch.zeros(4, 3, 2, 2), "decoder.w": torch.zeros(2)}, str(path))
    with pytest.raises(CheckpointError) as e:
        vitkit.load_model(path)
    for name in ("timm", "hf-transformers", "jax-npz", "clip", "dinov2", "torchvision"):
        assert name in str(e.value)
    assert "encoder.stem.weight" in str(e.value)
    rc, _, err = _convert(capsys, path, tmp_path / "out.safetensors")
    assert rc == 2 and err.count("\n") == 1 and "unrecognised checkpoint layout" in err
    assert not (tmp_path / "out.safetensors").exists()


def test_wrong_model_names_key_and_both_shapes(tmp_path, capsys):
    peer = TimmViT(img_size=224, patch_size=16, embed_dim=192, depth=2, num_heads=3, mlp_ratio=2.0)
    save_file(peer.state_dict(), str(tmp_path / "w.safetensors"))
    rc, _, err = _convert(capsys, tmp_path / "w.safetensors", tmp_path / "out.safetensors",
                          "--model", "vit_tiny_patch16_224")
    assert rc == 2 and err.count("\n") == 1
    # names the first mismatching key (file order) and both shapes
    assert "shape mismatch for blocks.0.mlp.fc1." in err and "checkpoint (384," in err and "model (768," in err


def test_missing_and_unexpected_keys_are_listed(tmp_path):
    sd = {k: v for k, v in TimmViT(**TINY).state_dict().items() if not k.startswith("blocks.1.attn.")}
    sd["extra_adapter.weight"] = torch.zeros(3)
    save_file(sd, str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError) as e:
        vitkit.create_model("vit_tiny_patch16_224", checkpoint_path=tmp_path / "w.safetensors", **TINY)
    msg = str(e.value)
    assert "missing 4 key(s)" in msg and "blocks.1.attn.qkv.weight" in msg and "blocks.1.attn.proj.bias" in msg
    assert "unexpected 1 key(s): extra_adapter.weight" in msg


def test_head_count_from_source_must_match(tmp_path):
    from transformers import ViTConfig, ViTModel

    ViTModel(ViTConfig(hidden_size=128, num_hidden_layers=1, num_attention_heads=2, intermediate_size=512,
                       image_size=32, patch_size=8)).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="checkpoint has 2 attention heads, the model 4"):
        vitkit.create_model("vit_tiny_patch16_224", checkpoint_path=tmp_path, **dict(TINY, depth=1, num_heads=4,
                                                                                     num_classes=0))


def test_formerly_refused_variants_convert(tmp_path, capsys):
    """DINOv2 ViT-g (SwiGLU w12/w3) and big_vision MAP-head files were refused; `vitkit convert` now imports
    them (their parity with timm: tests/test_import_refusals_gone.py)."""
    _, hub = dinov2_giant_file("vit_giant_patch14_dinov2", registers=False)
    torch.save(hub, tmp_path / "dinov2_vitg14.pth")
    rc, info, err = _convert(capsys, tmp_path / "dinov2_vitg14.pth", tmp_path / "g.safetensors")
    assert rc == 0, err
    assert info["layout"] == "dinov2" and info["config"]["mlp_layer"] == "swiglu_packed"
    big_vision_map_file(tmp_path / "siglip.npz")
    rc, info, err = _convert(capsys, tmp_path / "siglip.npz", tmp_path / "siglip.safetensors")
    assert rc == 0, err
    assert info["layout"] == "big_vision-npz" and info["config"]["global_pool"] == "map"


def test_convert_table_keeps_each_value_on_one_line(tmp_path, capsys, monkeypatch):
    """An 80-column terminal: the guessed preprocessing reads as its own row, no value is wrapped and no
    parenthesis is doubled (it printed '(from default' / '(guessed))' over two lines)."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(tmp_path)  # short relative paths: a long path may fold, the fields must not
    save_file({k: v.contiguous() for k, v in TimmViT(**TINY).state_dict().items()}, "timm_tiny.safetensors")
    assert main(["convert", "timm_tiny.safetensors", "out.safetensors"]) == 0
    out = capsys.readouterr().out
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    assert all(len(c) == 2 and c[0] for c in cells), out  # a wrapped value continues under an empty first cell
    rows = dict(cells)
    assert "))" not in out and rows["preprocess from"] == "default (guessed)"
    assert rows["mean / std"] == "0.485,0.456,0.406 / 0.229,0.224,0.225"
