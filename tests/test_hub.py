"""pretrained=True goes through huggingface_hub's cache: offline without the files is one clear error;
offline with the files (hub cache layout) loads timm's weights."""
from __future__ import annotations

import os
import subprocess
import sys

import torch
from safetensors.torch import save_file

import vitkit

REPO = "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k"


def test_offline_empty_cache_is_a_clear_error(tmp_path):
    """huggingface_hub reads HF_HUB_OFFLINE / HF_HUB_CACHE at import time: run in a fresh interpreter."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), HF_HOME=str(tmp_path / "home"))
    code = ("import vitkit\n"
            "try:\n    vitkit.create_model('vit_tiny_patch16_224', pretrained=True)\n"
            "except vitkit.OfflineError as e:\n    print('OfflineError:', e)\n")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert res.returncode == 0, res.stderr
    msg = res.stdout.strip()
    assert msg.startswith("OfflineError:") and "\n" not in msg
    assert str(cache) in msg and "checkpoint_path" in msg and REPO in msg


def test_pretrained_from_local_hub_cache(tmp_path, monkeypatch, photo_batch, record_parity):
    import timm
    from huggingface_hub import constants

    peer = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in peer.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = tmp_path / ("models--" + REPO.replace("/", "--"))
    snap = repo_dir / "snapshots" / commit
    snap.mkdir(parents=True)
    save_file(peer.state_dict(), str(snap / "model.safetensors"))
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)

    vk = vitkit.create_model("vit_tiny_patch16_224", pretrained=True).eval()
    assert vk.provenance["source"] == f"hub:{REPO}"
    x = photo_batch(224)
    with torch.no_grad():
        ref_logits, ref_feats = peer(x), peer.forward_head(peer.forward_features(x), pre_logits=True)
        lo = (vk(x) - ref_logits).abs().max().item()
        fe = (vk.forward_head(vk.forward_features(x), pre_logits=True) - ref_feats).abs().max().item()
    record_parity("hub cache vit_tiny_patch16_224 pretrained=True", lo, fe)
    assert lo <= 1e-4 and fe <= 1e-4
