"""Whole pretraining models load in one call (issue 21 item 5): `vitkit.load_model` of an MAE pretraining file
(transformers' ViTMAEForPreTraining folder, MAE's own checkpoint) is the encoder with its decoder, whose
`forward(x, noise=...)` gives the peer's loss, prediction and mask; of an OpenAI / open_clip pair file, the whole
CLIP with open_clip's logits; of a DINO training checkpoint, the backbone with DINO's head. The image model alone
stays one argument away (`tower="image"`, or a ViT name with `checkpoint_path=`). Every peer is built here with
random weights: transformers' own class, and transcriptions of MAE's models_mae.py and DINO's DINOHead."""
from __future__ import annotations

import argparse
from functools import partial

import numpy as np
import open_clip
import pytest
import torch
from safetensors.torch import save_file
from timm.models.vision_transformer import Block as TimmBlock
from timm.models.vision_transformer import PatchEmbed
from timm.models.vision_transformer import VisionTransformer as TimmViT
from torch import nn
from transformers import ViTMAEConfig, ViTMAEForPreTraining

import vitkit
from test_dino import RefDINOHead  # the transcription of DINO's DINOHead
from test_import_timm import perturb
from test_sincos import mae_get_2d_sincos_pos_embed
from vitkit.errors import CheckpointError, ConfigError

TOL = 1e-5


# ---------------------------------------------------------------------------- MAE
def _hf_mae(norm_pix: bool) -> ViTMAEForPreTraining:
    """A small ViTMAEForPreTraining with transformers' default LayerNorm eps (1e-12): the eps a decoder built by
    hand with MAE's 1e-6 would get wrong."""
    cfg = ViTMAEConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=2,
                       decoder_num_attention_heads=4, decoder_intermediate_size=64, norm_pix_loss=norm_pix,
                       mask_ratio=0.75)
    assert cfg.layer_norm_eps == 1e-12
    torch.manual_seed(0)
    peer = ViTMAEForPreTraining(cfg)
    peer.decoder.initialize_weights(16)  # transformers 5 fills the fixed sin-cos table lazily
    return perturb(peer)


@pytest.mark.parametrize("norm_pix", [True, False])
def test_hf_vitmae_pretraining_folder_loads_whole(norm_pix, tmp_path, photo_batch, record_parity):
    peer = _hf_mae(norm_pix)
    peer.save_pretrained(tmp_path / "mae", safe_serialization=True)
    x = photo_batch(32)
    noise = torch.rand(3, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = peer(pixel_values=x, noise=noise)
    assert ref.logits.std() > 1e-3
    mae = vitkit.load_model(tmp_path / "mae").eval()
    assert mae.family == "mae" and mae.provenance["imported_from"] == "hf-vitmae-pretraining"
    cfg = mae.cfg
    assert (cfg.decoder_dim, cfg.decoder_depth, cfg.decoder_heads, cfg.decoder_mlp_ratio) == (32, 2, 4, 2.0)
    assert cfg.decoder_eps == 1e-12 and cfg.encoder.norm_eps == 1e-12 and cfg.norm_pix_loss is norm_pix
    with torch.no_grad():
        out = mae(x, noise=noise)
    assert set(out) >= {"loss", "pred", "mask"}
    assert torch.equal(out["mask"], ref.mask) and torch.equal(out["ids_restore"], ref.ids_restore)
    d_pred, d_loss = (out["pred"] - ref.logits).abs().max().item(), abs(out["loss"].item() - ref.loss.item())
    record_parity(f"HF ViTMAEForPreTraining whole (norm_pix={norm_pix}) pred | loss", d_pred, d_loss)
    assert d_pred <= TOL and d_loss <= TOL, (d_pred, d_loss)
    # the image model alone, as before: the encoder (a ViT) with the file's weights
    encoder = vitkit.load_model(tmp_path / "mae", tower="image").eval()
    assert encoder.family == "vit" and encoder.provenance["tower"] == "image"
    with torch.no_grad():
        assert torch.equal(encoder.forward_features(x), mae.encoder.forward_features(x))
        assert torch.equal(mae(x), encoder(x))  # a plain call is the image side, as every vitkit model


class MaskedAutoencoderViT(nn.Module):
    """facebookresearch/mae models_mae.py, transcribed (timm's PatchEmbed and Block, LayerNorm eps 1e-6); the one
    change: random_masking takes the noise, so both sides hide the same patches."""

    def __init__(self, img_size=32, patch_size=8, in_chans=3, embed_dim=128, depth=2, num_heads=2,
                 decoder_embed_dim=64, decoder_depth=2, decoder_num_heads=16, mlp_ratio=4.0, norm_pix_loss=True):
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=1e-6)  # MAE's
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        grid = (img_size // patch_size,) * 2
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        table = np.concatenate([np.zeros([1, embed_dim]), mae_get_2d_sincos_pos_embed(embed_dim, grid)])
        self.pos_embed = nn.Parameter(torch.from_numpy(table).float()[None], requires_grad=False)
        self.blocks = nn.ModuleList([TimmBlock(embed_dim, num_heads, mlp_ratio, qkv_bias=True, norm_layer=norm_layer)
                                     for _ in range(depth)])
        self.norm = norm_layer(embed_dim)
        self.decoder_embed = nn.Linear(embed_dim, decoder_embed_dim, bias=True)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, decoder_embed_dim))
        table = np.concatenate([np.zeros([1, decoder_embed_dim]), mae_get_2d_sincos_pos_embed(decoder_embed_dim, grid)])
        self.decoder_pos_embed = nn.Parameter(torch.from_numpy(table).float()[None], requires_grad=False)
        self.decoder_blocks = nn.ModuleList([TimmBlock(decoder_embed_dim, decoder_num_heads, mlp_ratio, qkv_bias=True,
                                                       norm_layer=norm_layer) for _ in range(decoder_depth)])
        self.decoder_norm = norm_layer(decoder_embed_dim)
        self.decoder_pred = nn.Linear(decoder_embed_dim, patch_size ** 2 * in_chans, bias=True)
        self.norm_pix_loss = norm_pix_loss
        self.p = patch_size

    def patchify(self, imgs):
        p = self.p
        h = w = imgs.shape[2] // p
        x = imgs.reshape(shape=(imgs.shape[0], 3, h, p, w, p))
        x = torch.einsum("nchpwq->nhwpqc", x)
        return x.reshape(shape=(imgs.shape[0], h * w, p ** 2 * 3))

    def random_masking(self, x, mask_ratio, noise):
        N, L, D = x.shape
        len_keep = int(L * (1 - mask_ratio))
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L], device=x.device)
        mask[:, :len_keep] = 0
        mask = torch.gather(mask, dim=1, index=ids_restore)
        return x_masked, mask, ids_restore

    def forward_encoder(self, x, mask_ratio, noise):
        x = self.patch_embed(x)
        x = x + self.pos_embed[:, 1:, :]
        x, mask, ids_restore = self.random_masking(x, mask_ratio, noise)
        cls_token = self.cls_token + self.pos_embed[:, :1, :]
        x = torch.cat((cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, x, ids_restore):
        x = self.decoder_embed(x)
        mask_tokens = self.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        x_ = torch.gather(x_, dim=1, index=ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1)
        x = x + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:, :]

    def forward_loss(self, imgs, pred, mask):
        target = self.patchify(imgs)
        if self.norm_pix_loss:
            mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        loss = ((pred - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum()

    def forward(self, imgs, mask_ratio=0.75, noise=None):
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio, noise)
        pred = self.forward_decoder(latent, ids_restore)
        return self.forward_loss(imgs, pred, mask), pred, mask


def test_original_mae_pretraining_checkpoint_loads_whole(tmp_path, photo_batch, record_parity):
    """MAE's file records no head counts: 64-wide encoder heads (weights.infer) and MAE's 16 decoder heads are
    assumed, as its models have them; the peer is built so."""
    torch.manual_seed(0)
    peer = perturb(MaskedAutoencoderViT())
    path = tmp_path / "mae_visualize_vit_tiny.pth"  # MAE's layout: {'model': sd, ...}, MAE's own key names
    torch.save({"model": peer.state_dict(), "epoch": 799, "args": argparse.Namespace(model="mae_vit_tiny",
                                                                                     norm_pix_loss=True)}, path)
    x = photo_batch(32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    noise = torch.rand(3, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        loss, pred, mask = peer(x, 0.75, noise)
    mae = vitkit.load_model(path).eval()
    assert mae.family == "mae" and mae.provenance["imported_from"] == "mae"
    assert (mae.cfg.decoder_heads, mae.cfg.decoder_eps, mae.cfg.norm_pix_loss) == (16, 1e-6, True)
    with torch.no_grad():
        out = mae(x, noise=noise)
    assert torch.equal(out["mask"], mask)
    d_pred, d_loss = (out["pred"] - pred).abs().max().item(), abs(out["loss"].item() - loss.item())
    record_parity("MAE original pretraining checkpoint whole pred | loss", d_pred, d_loss)
    assert d_pred <= TOL and d_loss <= TOL, (d_pred, d_loss)
    # a vitkit file of the whole model reads back whole, without any of the assumptions
    again = vitkit.load_model(vitkit.save_model(mae, tmp_path / "mae.safetensors")).eval()
    assert again.cfg == mae.cfg
    with torch.no_grad():
        assert torch.equal(again(x, noise=noise)["pred"], out["pred"])
    # the encoder through a ViT name (what fine-tuning from MAE weights does) and through tower="image"
    name = vitkit.create_model("vit_base_patch16_mae", embed_dim=128, depth=2, num_heads=2, img_size=32,
                               patch_size=8, checkpoint_path=path).eval()
    with torch.no_grad():
        assert torch.equal(name.forward_features(x), mae.encoder.forward_features(x))
    assert vitkit.load_model(path, tower="image").family == "vit"


def test_continuing_pretraining_from_a_whole_mae(tmp_path):
    """The model a `--task mae` run continues from: one load gives the encoder to train and the decoder with the
    file's settings; a step on it trains both."""
    torch.manual_seed(0)
    peer = perturb(MaskedAutoencoderViT())
    torch.save({"model": peer.state_dict()}, tmp_path / "mae.pth")
    mae = vitkit.load_model(tmp_path / "mae.pth").train()
    before = {k: v.clone() for k, v in mae.state_dict().items()}
    opt = torch.optim.SGD(mae.parameters(), lr=0.1)
    out = mae(torch.randn(4, 3, 32, 32), mask_ratio=0.75)  # random masks: a training step
    assert out["mask"].sum(1).tolist() == [12.0] * 4
    out["loss"].backward()
    opt.step()
    changed = {k.split(".")[0] for k, v in mae.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {"encoder", "decoder"}


def test_finetuning_from_a_whole_mae_trains_its_encoder(tmp_path):
    """`vitkit train --finetune` of a whole pretraining file fine-tunes the image tower (a ViT with a new head),
    as it did when such files loaded as their encoder only."""
    from vitkit.training import models as model_io
    from vitkit.training.recipes import get_recipe

    _hf_mae(norm_pix=True).save_pretrained(tmp_path / "mae", safe_serialization=True)
    recipe = get_recipe("digits").replace(drop_path_rate=0.05, model_args={})  # the file decides the shape
    model = model_io.build(recipe, num_classes=10, data_channels=1, data_size=(8, 8), finetune=tmp_path / "mae")
    assert model.family == "vit" and model.cfg.num_classes == 10 and model.cfg.embed_dim == 64
    assert model.cfg.drop_path_rate == 0.05 and model.provenance["finetuned_from"] == str(tmp_path / "mae")
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


# ---------------------------------------------------------------------------- CLIP
def _open_clip_pair(tmp_path):
    torch.manual_seed(0)
    peer = open_clip.CLIP(32, open_clip.CLIPVisionCfg(layers=2, width=128, head_width=64, patch_size=8, image_size=32),
                          open_clip.CLIPTextCfg(width=128, heads=2, layers=1), quick_gelu=True)
    peer = perturb(peer)
    path = tmp_path / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(path))
    return peer, path


def test_clip_pair_loads_whole_and_its_image_tower_on_request(tmp_path, photo_batch, record_parity):
    peer, path = _open_clip_pair(tmp_path)
    x = photo_batch(32, mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711))
    ids = open_clip.tokenize(["a photo of a cat", "an astronaut", "a cup of coffee"])
    clip = vitkit.load_model(path, text_heads=2).eval()  # the text heads are not 64 wide: stated
    assert clip.family == "clip" and "encode_text" in clip.capabilities
    with torch.no_grad():
        ref_logits, _ = peer.get_logits(x, ids)
        logits, _ = clip(x, ids)
        image_side = clip(x)  # the image tower's contract: the image embedding without a classifier
        ref_image = peer.encode_image(x)
    d = (logits - ref_logits).abs().max().item()
    record_parity("open_clip pair via load_model logits | image embedding", d, (image_side - ref_image).abs().max().item())
    assert d <= 1e-4 and (image_side - ref_image).abs().max() <= 1e-4 and ref_logits.std() > 0.1
    # the image tower alone: tower="image", or a ViT name with the pair as its checkpoint
    vit = vitkit.load_model(path, tower="image").eval()
    assert vit.family == "vit" and vit.provenance["imported_from"] == "openai-clip"
    tower_name = vitkit.create_model("vit_base_patch32_clip_quickgelu_224", checkpoint_path=path, img_size=32,
                                     patch_size=8, embed_dim=128, depth=2, num_heads=2, num_classes=32).eval()
    with torch.no_grad():
        assert (vit(x) - ref_image).abs().max() <= 1e-4
        assert torch.equal(tower_name(x), vit(x))
    # zero-shot's loader is this call
    from vitkit.zeroshot import load_clip

    same = load_clip(path, text_heads=2).eval()
    with torch.no_grad():
        assert torch.equal(same(x, ids)[0], logits)


def test_a_tower_a_model_does_not_have_is_one_line(tmp_path):
    _, path = _open_clip_pair(tmp_path)
    with pytest.raises(ConfigError, match="no tower 'text'"):
        vitkit.load_model(path, tower="text")
    vit = vitkit.save_model(vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32, num_classes=2),
                            tmp_path / "vit.safetensors")
    assert vitkit.load_model(vit, tower="image").family == "vit"  # a ViT is its own image tower
    with pytest.raises(CheckpointError, match="holds a vit model; resnet18 is a resnet model"):
        vitkit.create_model("resnet18", checkpoint_path=vit)


def test_registered_clip_names_have_their_pretrained_files():
    """OpenAI's pairs are open_clip's files in timm's hub repos (model.safetensors there is the image tower)."""
    from vitkit.models import get_entry
    from vitkit.weights.layouts import hub_files

    for name, timm_name in (("clip_vit_base_patch32", "vit_base_patch32_clip_224"),
                            ("clip_vit_base_patch16", "vit_base_patch16_clip_224"),
                            ("clip_vit_large_patch14", "vit_large_patch14_clip_224")):
        assert get_entry(name).hub == {"openai": f"timm/{timm_name}.openai"}
    assert hub_files("clip")[0] == "open_clip_model.safetensors" and hub_files("vit") == ("model.safetensors",)


# ---------------------------------------------------------------------------- DINO
def dino_checkpoint(path, use_bn: bool = False):
    """A DINO v1 training checkpoint as main_dino.py saves it; returns (teacher backbone, teacher head)."""
    torch.manual_seed(0)
    # 64-wide heads: what is assumed for a file that does not record them
    backbone = perturb(TimmViT(img_size=32, patch_size=8, embed_dim=128, depth=2, num_heads=2, num_classes=0))
    head = RefDINOHead(128, 40, use_bn=use_bn, hidden_dim=48, bottleneck_dim=16)
    with torch.no_grad():
        for p in head.parameters():
            if p.requires_grad:  # weight_g stays 1 (norm_last_layer)
                p.add_(0.05 * torch.randn(p.shape))
    head.eval()
    teacher = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    teacher |= {f"head.{k}": v for k, v in head.state_dict().items()}
    student = {f"module.{k}": v + 1.0 for k, v in teacher.items()}  # other numbers: must not be picked
    torch.save({"teacher": teacher, "student": student, "epoch": 100, "dino_loss": {"center": torch.zeros(1, 40)},
                "optimizer": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0, 1]}]},
                "args": argparse.Namespace(arch="vit_tiny", patch_size=8, out_dim=40)}, path)
    return backbone, head


@pytest.mark.parametrize("use_bn", [False, True])
def test_dino_training_checkpoint_loads_with_its_head(use_bn, tmp_path, photo_batch, record_parity):
    path = tmp_path / "checkpoint.pth"
    backbone, head = dino_checkpoint(path, use_bn)
    x = photo_batch(32, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    with torch.no_grad():
        ref_feats = backbone(x)  # [3, 128] the class token
        ref_protos = head(ref_feats)  # [3, 40]
    dino = vitkit.load_model(path).eval()
    assert dino.family == "dino" and dino.provenance["imported_from"] == "dino"
    assert (dino.cfg.out_dim, dino.cfg.hidden_dim, dino.cfg.bottleneck_dim, dino.cfg.head_layers) == (40, 48, 16, 3)
    assert dino.cfg.use_bn is use_bn and dino.cfg.norm_last_layer
    with torch.no_grad():
        protos, feats = dino(x, prototypes=True), dino(x)
    d_protos, d_feats = (protos - ref_protos).abs().max().item(), (feats - ref_feats).abs().max().item()
    record_parity(f"DINO training checkpoint with head (bn={use_bn}) prototypes | features", d_protos, d_feats)
    assert d_protos <= TOL and d_feats <= TOL and ref_protos.std() > 1e-3
    # the backbone alone, as before: a ViT
    vit = vitkit.load_model(path, tower="image").eval()
    with torch.no_grad():
        assert vit.family == "vit" and (vit(x) - ref_feats).abs().max() <= TOL
