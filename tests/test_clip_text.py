"""The `clip` family against open_clip: a random-weight pair built by open_clip's own `CLIP(embed_dim, vision_cfg,
text_cfg)`, every parameter perturbed, saved as open_clip saves it, read by vitkit.zeroshot.load_clip:
`encode_image`, `encode_text` and the logits agree within 1e-4, with QuickGELU (OpenAI's weights) and GELU."""
from __future__ import annotations

import open_clip
import pytest
import torch
from safetensors.torch import save_file

import vitkit
from vitkit.errors import CheckpointError, ConfigError
from vitkit.text import tokenize
from vitkit.zeroshot import load_clip

# the registered `clip_vit_tiny_test`: 32 px, patch 8, both towers 32 wide with 2 heads and 2 layers, embedding 32
VISION = dict(layers=2, width=32, head_width=16, patch_size=8, image_size=32)
TEXT = dict(context_length=77, vocab_size=49408, width=32, heads=2, layers=2)
PROMPTS = ["a photo of a cat.", "", "an astronaut riding a horse on the moon, oil painting " * 8, "Ünïcödé 🐱!"]


def peer_pair(quick_gelu: bool) -> open_clip.CLIP:
    torch.manual_seed(0)
    peer = open_clip.CLIP(32, open_clip.CLIPVisionCfg(**VISION), open_clip.CLIPTextCfg(**TEXT),
                          quick_gelu=quick_gelu).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # away from the init: LayerNorms, biases and the scale all matter
        for p in peer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return peer


def images(photo_batch) -> torch.Tensor:
    return photo_batch(32, mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))


@pytest.mark.parametrize("act", ["quick_gelu", "gelu"])
def test_parity_with_open_clip(act, tmp_path, photo_batch, record_parity):
    peer = peer_pair(act == "quick_gelu")
    path = tmp_path / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(path))
    ours = load_clip(path, act=act, text_heads=2, vision_heads=2).eval()
    assert ours.family == "clip" and ours.cfg.vision.act == act and ours.cfg.text_layers == 2
    if act == "quick_gelu":  # the file is recognised as the registered config
        assert ours.provenance["arch"] == "clip_vit_tiny_test" and ours.cfg == vitkit.models.get_entry(
            "clip_vit_tiny_test").cfg
    x, ids = images(photo_batch), open_clip.tokenize(PROMPTS)
    with torch.no_grad():
        ref_img, ref_txt = peer.encode_image(x), peer.encode_text(ids)
        ref_logits, ref_logits_t = peer.get_logits(x, ids)
        img, txt = ours.encode_image(x), ours.encode_text(ids)
        logits, logits_t = ours(x, ids)
    d_img, d_txt = (img - ref_img).abs().max().item(), (txt - ref_txt).abs().max().item()
    d_logits = (logits - ref_logits).abs().max().item()
    record_parity(f"open_clip CLIP pair ({act}) logits | text features", d_logits, d_txt)
    assert d_img <= 1e-4 and d_txt <= 1e-4 and d_logits <= 1e-4, (d_img, d_txt, d_logits)
    assert torch.equal(logits_t, logits.t()) and (ref_logits_t - logits_t).abs().max() <= 1e-4
    assert ref_txt.abs().max() > 0.1 and ref_logits.std() > 0.1  # the comparison is not between near-zeros
    # a vitkit file of the pair gives the same outputs, without the options a foreign file needs
    again = vitkit.load_model(vitkit.save_model(ours, tmp_path / "pair.safetensors")).eval()
    with torch.no_grad():
        assert torch.equal(again(x, ids)[0], logits)


def test_openai_pickle_in_a_training_container(tmp_path, photo_batch):
    """An open_clip training checkpoint (.pt): DDP names inside 'state_dict', read by the weights-only loader;
    the text tower pools at the end-of-text token, whatever follows it."""
    peer = peer_pair(True)
    path = tmp_path / "epoch_3.pt"
    torch.save({"epoch": 3, "state_dict": {"module." + k: v for k, v in peer.state_dict().items()}}, path)
    ours = load_clip(path, text_heads=2, vision_heads=2).eval()
    ids = tokenize(["a dog", "a cat"])
    padded = ids.clone()
    padded[:, 4:] = 7  # tokens after EOT (id 49407, the largest) change nothing for a causal tower
    with torch.no_grad():
        assert torch.allclose(ours.encode_text(ids), ours.encode_text(padded), atol=1e-6)
        assert (ours.encode_text(ids) - peer.encode_text(ids)).abs().max() <= 1e-4


def test_bad_pairs_are_one_line_errors(tmp_path):
    peer = peer_pair(True)
    sd = peer.state_dict()
    visual_only = {k: v for k, v in sd.items() if k.startswith("visual.")}
    with pytest.raises(CheckpointError, match="image tower only"):
        load_clip(visual_only)
    with pytest.raises(CheckpointError, match="not an OpenAI / open_clip CLIP checkpoint"):
        load_clip({"fc.weight": torch.zeros(2, 2)})
    with pytest.raises(CheckpointError, match="not a CLIP pair"):
        vit = vitkit.create_model("vit_tiny_patch16_224", depth=1, num_classes=2, img_size=32)
        load_clip(vitkit.save_model(vit, tmp_path / "vit.safetensors"))
    # 64-wide heads assumed, 2 stated by the peer: a head count that does not divide the width fails clearly
    with pytest.raises(ConfigError, match="not divisible"):
        load_clip(sd, text_heads=3, vision_heads=2)
    model = vitkit.create_model("clip_vit_tiny_test")
    with pytest.raises(ConfigError, match="1..77"):
        model.encode_text(torch.ones(1, 78, dtype=torch.long))
    with pytest.raises(ConfigError, match="unknown model option"):
        vitkit.create_model("clip_vit_tiny_test", text_widht=8)


def test_registered_pairs_match_open_clip_sizes():
    """The registered OpenAI configs have open_clip's parameter counts (built on the meta device), plus the
    image projection's zero bias vitkit keeps."""
    for ours, theirs in (("clip_vit_base_patch32", "ViT-B-32-quickgelu"), ("clip_vit_large_patch14", "ViT-L-14-quickgelu")):
        with torch.device("meta"):
            mine = vitkit.create_model(ours)
            peer = open_clip.create_model(theirs, device="meta")
        n_mine = sum(p.numel() for p in mine.parameters())
        n_peer = sum(p.numel() for p in peer.parameters())
        assert n_mine == n_peer + mine.embed_dim, (ours, n_mine, n_peer)
        assert mine.cfg.context_length == peer.context_length and mine.cfg.vocab_size == peer.vocab_size
