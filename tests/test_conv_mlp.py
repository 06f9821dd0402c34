"""The depthwise-conv MLP (mlp_layer='mlp_dwconv', PVTv2's): timm's numbers and key names, a 3x3 neighbourhood on
the patch grid in the patch embedding's row-major order, prefix tokens left out of the conv, files that rebuild it,
and one line where the tokens are no whole grid."""
from __future__ import annotations

import pytest
import torch
from timm.models.pvt_v2 import MlpWithDepthwiseConv as TimmDwConvMlp

import vitkit
from test_import_timm import perturb as perturbed
from vitkit.errors import ConfigError
from vitkit.layers.mlp import DepthwiseConvMlp
from vitkit.layers.naflex import image_patches, pad_patches

SMALL = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, mlp_layer="mlp_dwconv")


def test_matches_timm_pvt_v2_mlp_on_a_non_square_grid():
    peer = perturbed(TimmDwConvMlp(16, 24))
    mine = DepthwiseConvMlp(16, 24)
    mine.load_state_dict(peer.state_dict())  # timm's key names: fc1, dwconv, fc2
    x = torch.randn(2, 3 * 5, 16)  # a 3 x 5 grid: a transposed reshape would not match
    with torch.no_grad():
        assert (mine(x, (3, 5)) - peer(x, [3, 5])).abs().max() <= 1e-5


@pytest.mark.parametrize("prefix", [0, 2])
def test_a_token_reaches_exactly_its_3x3_neighbours_and_prefix_tokens_skip_the_conv(prefix):
    torch.manual_seed(0)
    mlp = DepthwiseConvMlp(8, 16).eval()
    gh, gw = 4, 6
    x = torch.randn(1, prefix + gh * gw, 8)
    r, c = 1, 4
    moved = x.clone()
    moved[0, prefix + r * gw + c] += 1.0  # one patch token, row-major position (r, c)
    with torch.no_grad():
        changed = (mlp(moved, (gh, gw)) - mlp(x, (gh, gw))).abs().amax(-1)[0] > 1e-6  # [P + N]
    assert not changed[:prefix].any()
    want = torch.zeros(gh, gw, dtype=torch.bool)
    want[r - 1:r + 2, c - 1:c + 2] = True
    assert torch.equal(changed[prefix:].view(gh, gw), want)
    # a prefix token's own output is the plain MLP's: fc1 -> act -> fc2, no conv
    with torch.no_grad():
        plain = mlp.fc2(mlp.act(mlp.fc1(x[:, :prefix])))
        assert torch.allclose(mlp(x, (gh, gw))[:, :prefix], plain, atol=1e-6)


def test_a_model_with_it_trains_resizes_gives_dense_features_and_its_file_rebuilds_it(tmp_path):
    torch.manual_seed(0)
    m = vitkit.create_model("vit_tiny_patch16_224", num_classes=5, **SMALL)
    assert all(type(b.mlp) is DepthwiseConvMlp for b in m.blocks)
    x = torch.randn(2, 3, 32, 32)
    m.forward_features(x).pow(2).sum().backward()  # (the head starts at zero: no gradient through it yet)
    assert all(b.mlp.dwconv.weight.grad.abs().sum() > 0 for b in m.blocks)
    m.eval()
    path = vitkit.save_model(m, tmp_path / "m.safetensors")
    again = vitkit.load_model(path)
    assert again.cfg.mlp_layer == "mlp_dwconv"
    with torch.no_grad():
        assert torch.equal(again(x), m(x))
        feats = m.forward_intermediates(x, indices=1, intermediates_only=True)
        assert feats[0].shape == (2, 32, 4, 4)
        m.set_input_size((48, 32))  # a 6 x 4 grid: the conv follows the input's grid
        assert m(torch.randn(1, 3, 48, 32)).shape == (1, 5)


def test_inputs_that_are_no_whole_grid_get_one_line():
    m = vitkit.create_model("vit_tiny_patch16_224", num_classes=5, **SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    for keep in (torch.arange(8), torch.arange(16).flip(0)):  # MAE's visible subset; every patch, reordered
        with pytest.raises(ConfigError, match="whole patch grid"):
            m.forward_features(x, keep=keep.expand(2, -1))
    batch = pad_patches([image_patches(torch.randn(3, 32, 32), 8)])
    with pytest.raises(ConfigError, match="whole patch grid"):
        m(batch)
    with pytest.raises(ConfigError, match="merge=2"):
        vitkit.create_model("vit_tiny_patch16_224", merge=2, **SMALL)


def test_it_exports_to_onnx_runtime_with_the_same_logits():
    torch.manual_seed(0)
    m = vitkit.create_model("vit_tiny_patch16_224", num_classes=5, **SMALL).eval()
    x = torch.randn(2, 3, 32, 32)
    run = vitkit.runner(m, backend="onnx", precision="fp32")
    with torch.no_grad():
        assert (torch.as_tensor(run(x)) - m(x)).abs().max() <= 1e-4
