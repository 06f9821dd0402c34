"""Native aspect ratio under a token budget (NaFlex, layers/naflex.py): the grid rule against timm's, the model on a
padded batch against timm's NaFlexViT loading the same classic checkpoint, an image in a padded batch against the
image alone, SDPA against the eager path (attention maps), masked pooling, and the refusals."""
from __future__ import annotations

import pytest
import torch
from timm.data.naflex_transforms import get_image_size_for_seq
from timm.models.naflexvit import NaFlexVit, checkpoint_filter_fn

import vitkit
from vitkit.errors import ConfigError
from vitkit.layers.naflex import grid_for_budget, image_patches, pad_patches
from vitkit.peers import timm_twin

PATCH = 8


@pytest.mark.parametrize("hw", [(224, 224), (480, 640), (640, 480), (100, 1000), (37, 23), (8, 8), (1, 300)])
@pytest.mark.parametrize("budget", [1, 7, 64, 196, 256, 1000])
def test_the_grid_is_timms_largest_grid_within_the_budget(hw, budget):
    ours = grid_for_budget(*hw, PATCH, budget)
    _, (th, tw) = get_image_size_for_seq(hw, PATCH, budget)
    assert ours == (th // PATCH, tw // PATCH)
    assert ours[0] * ours[1] <= budget


def _model(global_pool="token", **kw):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", img_size=64, patch_size=PATCH, depth=2, num_classes=7,
                                global_pool=global_pool, **kw).eval()
    with torch.no_grad():  # every parameter away from its init (zero tokens and biases would hide mistakes)
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def _images(sizes, channels=3):
    g = torch.Generator().manual_seed(1)
    return [torch.randn(channels, h, w, generator=g) for h, w in sizes]


def _batch(images):
    return pad_patches([image_patches(im, PATCH) for im in images])


SIZES = [(64, 64), (32, 96), (72, 40), (16, 16)]  # grids 8x8, 4x12, 9x5, 2x2: three pad to 64 tokens


@pytest.mark.parametrize("global_pool,kw", [("token", {}), ("avg", {"class_token": False, "fc_norm": True}),
                                            ("token", {"reg_tokens": 2, "prefix_pos": False}),
                                            ("map", {"class_token": False})])
def test_a_padded_batch_equals_timms_naflexvit_on_the_same_checkpoint(global_pool, kw):
    # registers with position rows of their own are left out: timm 1.0.31's filter folds only the first register's
    # row into its tokens (`v[:, num_cls_token:num_reg_token]`), so timm's NaFlexViT differs from its own classic ViT
    model = _model(global_pool, **kw)
    twin = timm_twin(model) if global_pool != "map" else None
    if twin is not None:  # the classic checkpoint, loaded into timm's NaFlexViT by timm's own filter
        classic = twin.state_dict()
    else:
        classic = model.state_dict()
    naflex = NaFlexVit(img_size=64, num_classes=7, patch_size=PATCH, embed_dim=192, depth=2, num_heads=3,
                       class_token=global_pool == "token", reg_tokens=kw.get("reg_tokens", 0), global_pool=global_pool,
                       fc_norm=kw.get("fc_norm", False), pos_embed_grid_size=None).eval()
    naflex.load_state_dict(checkpoint_filter_fn(dict(classic), naflex))
    images = _images(SIZES)
    batch = _batch(images)
    # timm's input: the same patches in its (P, P, C) order with (y, x) coordinates and validity
    L = batch.patches.shape[1]
    patches, coords = torch.zeros(len(images), L, PATCH * PATCH * 3), torch.zeros(len(images), L, 2, dtype=torch.long)
    for b, im in enumerate(images):
        gh, gw = im.shape[1] // PATCH, im.shape[2] // PATCH
        p = im.reshape(3, gh, PATCH, gw, PATCH).permute(1, 3, 2, 4, 0).reshape(gh * gw, -1)
        patches[b, : gh * gw] = p
        yy, xx = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        coords[b, : gh * gw] = torch.stack([yy.flatten(), xx.flatten()], 1)
    with torch.no_grad():
        theirs = naflex({"patches": patches, "patch_coord": coords, "patch_valid": batch.valid})
        ours = model(batch)
    assert ours.shape == (4, 7)
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()


@pytest.mark.parametrize("global_pool,kw", [("token", {}), ("avg", {"class_token": False}), ("max", {}),
                                            ("map", {"class_token": False})])
def test_an_image_in_a_padded_batch_equals_the_image_alone(global_pool, kw):
    model = _model(global_pool, **kw)
    images = _images(SIZES)
    with torch.no_grad():
        together = model(_batch(images))
        for b, im in enumerate(images):
            alone = model(_batch([im]))
            assert torch.allclose(together[b], alone[0], atol=1e-5), (b, (together[b] - alone[0]).abs().max())
            if im.shape[1:] == (64, 64):  # the native square: the same as the plain image path
                assert torch.allclose(alone, model(im[None]), atol=1e-5)


def test_a_batch_without_padding_takes_the_unmasked_kernels(monkeypatch):
    from vitkit.layers.naflex import key_padding_mask
    assert key_padding_mask(torch.ones(2, 5, dtype=torch.bool)) is None
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[1, 3:] = False
    assert key_padding_mask(valid).shape == (2, 1, 1, 5)
    # bf16 inference with the fused encoder layer on: square images as a PatchBatch run that kernel, as the plain
    # image path does (a padded batch does not), and give the plain path's tokens up to bf16 rounding
    model = _model().to(torch.bfloat16)
    for blk in model.blocks:
        blk.native_fastpath = True
    calls = []
    fused = torch._transformer_encoder_layer_fwd
    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", lambda *a: calls.append(1) or fused(*a))
    square = torch.randn(2, 3, 64, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        plain = model.forward_features(square).float()
        assert len(calls) == 2
        patched = model.forward_features(_batch(list(square))).float()
        assert len(calls) == 4
        model.forward_features(_batch(_images(SIZES[:2])).to(torch.bfloat16))
        assert len(calls) == 4
    assert torch.allclose(plain, patched, atol=0.05 * plain.abs().max().item())


def test_the_eager_path_gives_the_same_outputs_and_attention_maps_without_padding():
    model = _model()
    batch = _batch(_images(SIZES))
    with torch.no_grad():
        fused = model(batch)
        eager, attns = model(batch, return_attn=True)
    assert torch.allclose(fused, eager, atol=1e-5)
    lengths = batch.lengths.tolist()
    for a in attns:  # [B, H, T, T]: rows sum to one; no weight on padding keys
        assert a.shape == (4, 3, 1 + 64, 1 + 64)
        assert torch.allclose(a.sum(-1), torch.ones(4, 3, 65), atol=1e-5)
        for b, n in enumerate(lengths):
            assert a[b, :, :, 1 + n:].abs().sum() == 0


def test_a_padded_batch_trains_with_gradients_only_from_real_patches():
    model = _model("avg", class_token=False).train()
    batch = _batch(_images(SIZES))
    batch.patches.requires_grad_(True)
    model(batch).sum().backward()
    grad = batch.patches.grad  # [B, L, CPP]
    for b, n in enumerate(batch.lengths.tolist()):
        assert grad[b, :n].abs().sum() > 0
        assert grad[b, n:].abs().sum() == 0


def test_features_pool_over_valid_tokens_only():
    model = _model("avg", class_token=False)
    batch = _batch(_images(SIZES))
    with torch.no_grad():
        tokens = model.forward_features(batch)
        pooled = model.forward_head(tokens, pre_logits=True, valid=batch.token_mask(model.num_prefix_tokens))
        n = int(batch.lengths[3])
        assert torch.allclose(pooled[3], model.fc_norm(tokens[3, :n].mean(0)), atol=1e-5)


def test_max_tokens_on_the_model_and_its_refusals():
    model = _model()
    model.set_max_tokens(48)
    assert (model.preprocess.max_tokens, model.preprocess.token_patch) == (48, PATCH)
    model.set_input_size(img_size=64, patch_size=16)
    assert model.preprocess.token_patch == 16
    model.set_max_tokens(0)
    assert model.preprocess.max_tokens == 0
    with pytest.raises(ConfigError, match="at least 1"):
        model.set_max_tokens(-3)
    with pytest.raises(ConfigError, match="at least 1"):
        grid_for_budget(10, 10, 8, 0)
    merged = vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=2, merge=4)
    with pytest.raises(ConfigError, match="token merging"):
        merged.set_max_tokens(32)
    with pytest.raises(ConfigError, match="cut into 8x8 patches, the model cuts 16x16"):
        vitkit.create_model("vit_tiny_patch16_224", img_size=64, depth=2)(_batch(_images([(16, 16)])))
    with pytest.raises(ConfigError, match="square image batch"):
        model.forward_intermediates(_batch(_images([(16, 16)])))
