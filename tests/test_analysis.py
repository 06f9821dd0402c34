"""Attention weights, rollout, gradient rollout, mean attention distance, embedding analyses.

References are written out plainly here (explicit loops) so that they share no code with vitkit.
"""
import itertools
import math

import numpy as np
import pytest
import torch

from vitkit import VisionTransformer, ViTConfig
from vitkit.analysis.attention import (
    attention_rollout,
    attention_weights,
    cls_attention,
    discard_lowest,
    explain,
    grad_rollout,
    object_mass,
    rollout_matrix,
    token_map,
)
from vitkit.analysis.distance import model_attention_distance
from vitkit.analysis.embeddings import patch_filter_components, pos_embed_similarity

TINY = {"embed_dim": 32, "depth": 3, "num_heads": 4, "img_size": 32, "patch_size": 8, "num_classes": 5}


def tiny(sharp: float = 1.0, **kw) -> VisionTransformer:
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(**(TINY | kw))).eval()
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.qkv.weight.mul_(sharp)  # larger q/k make peaked, clearly asymmetric attention
    return m


def uniform(m: VisionTransformer) -> VisionTransformer:
    """q = k = 0 in every block: every attention row is uniform."""
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.qkv.weight.zero_()
            blk.attn.qkv.bias.zero_()
    return m


def force_attention(m: VisionTransformer, make):
    """Replace every block's attention probabilities via the attn_map hook point; returns the handles."""
    return [blk.attn.attn_map.register_forward_hook(lambda mod, inp, out: make(out)) for blk in m.blocks]


def images(n=2, h=32, w=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, h, w, generator=g)


def reference_rollout(attns, fusion="mean", discard=0.0):
    """Attention rollout with loops: per layer fuse heads, discard lowest per row (never column 0),
    add identity, divide each ROW by its sum; R = A_l @ ... @ A_1. attns: list of [H, T, T] lists."""
    T = len(attns[0][0])
    R = [[float(i == j) for j in range(T)] for i in range(T)]
    for layer in attns:
        H = len(layer)
        A = [[0.0] * T for _ in range(T)]
        for i in range(T):
            for j in range(T):
                vals = [layer[h][i][j] for h in range(H)]
                A[i][j] = {"mean": sum(vals) / H, "max": max(vals), "min": min(vals)}[fusion]
        k = int(T * discard)
        for i in range(T):
            lowest = sorted(range(1, T), key=lambda j: A[i][j])[:k]
            for j in lowest:
                A[i][j] = 0.0
        for i in range(T):
            A[i][i] += 1.0
            s = sum(A[i])
            A[i] = [v / s for v in A[i]]
        R = [[sum(A[i][m] * R[m][j] for m in range(T)) for j in range(T)] for i in range(T)]
    return torch.tensor(R, dtype=torch.float64)


# ---------------------------------------------------------------- attention weights
def test_eager_and_fused_logits_agree_and_hooks_see_probabilities():
    m = tiny(sharp=3.0)
    x = images()
    seen = []
    handles = [blk.attn.attn_map.register_forward_hook(lambda mod, inp, out: seen.append(out))
               for blk in m.blocks]
    with torch.no_grad():
        fused = m(x)
        assert seen == []  # the default path is fused SDPA: the probabilities are never formed
        eager, attns = m(x, return_attn=True)
    for h in handles:
        h.remove()
    assert torch.allclose(fused, eager, atol=1e-5, rtol=0)
    assert len(seen) == len(attns) == 3
    for hooked, a in zip(seen, attns):
        assert a.shape == (2, 4, 17, 17)
        assert torch.equal(hooked, a)
        assert torch.allclose(a.sum(-1), torch.ones(2, 4, 17), atol=1e-6)
    assert all(blk.attn.fused for blk in m.blocks)  # nothing was switched off for later calls


# ---------------------------------------------------------------- rollout
@pytest.mark.parametrize("fusion,discard", [("mean", 0.0), ("max", 0.3), ("min", 0.0)])
def test_rollout_matches_loop_reference_on_asymmetric_attention(fusion, discard):
    m = tiny(sharp=6.0)
    _, attns = attention_weights(m, images(n=2))
    a0 = attns[0][1].mean(0)
    assert not torch.allclose(a0, a0.T, atol=1e-2)  # asymmetric: row and column normalisation differ
    assert (a0.sum(0) - 1).abs().max() > 0.1
    got = rollout_matrix(attns, fusion, discard)  # [B, T, T]
    for b in range(2):
        ref = reference_rollout([a[b].double().tolist() for a in attns], fusion, discard)
        assert torch.allclose(got[b].double(), ref, atol=1e-5)
    if discard == 0.0:  # the normalisation bug this test exists for would be caught
        wrong = torch.eye(17).expand(2, 17, 17)
        for a in attns:
            a = a.mean(1) + torch.eye(17)
            wrong = (a / a.sum(dim=-2, keepdim=True)) @ wrong  # columns instead of rows
        assert not torch.allclose(wrong, got, atol=1e-3)


def test_rollout_rows_sum_to_one_and_map_is_class_row_over_patches():
    m = tiny(sharp=4.0, num_reg_tokens=2)
    _, attns = attention_weights(m, images())
    R = rollout_matrix(attns, "mean", 0.5)
    assert torch.allclose(R.sum(-1), torch.ones(2, 19), atol=1e-5)
    amap, _ = attention_rollout(m, images(), "mean", 0.5)
    assert amap.shape == (2, 4, 4)
    assert torch.allclose(amap.flatten(1), R[:, 0, 3:], atol=1e-6)


def test_discard_is_per_sample_and_keeps_class_column():
    a = torch.rand(3, 5, 6, 6)
    fused = a.mean(1)
    fused[:, :, 0] = 0.0  # the class column is the smallest, yet must survive
    out = discard_lowest(fused, 0.5)
    for b in range(3):  # every sample, not only the first
        single = discard_lowest(fused[b:b + 1], 0.5)[0]
        assert torch.equal(out[b], single)
        assert ((out[b][:, 1:] == 0).sum(-1) == 3).all()
    batched = rollout_matrix([a], discard_ratio=0.5)
    assert torch.allclose(batched[2], rollout_matrix([a[2:3]], discard_ratio=0.5)[0])


def test_uniform_attention_gives_uniform_maps():
    m = uniform(tiny())
    x = images()
    amap, _ = attention_rollout(m, x)
    heads, _ = cls_attention(m, x)
    assert torch.allclose(amap, amap[:, :1, :1].expand_as(amap), atol=1e-7)
    assert torch.allclose(heads, torch.full_like(heads, 1 / 17), atol=1e-7)


def one_hot_to(k_token):
    def make(out):
        forced = torch.zeros_like(out)
        forced[..., k_token] = 1.0  # every query attends only to token k
        return forced
    return make


@pytest.mark.parametrize("kw", [{}, {"distilled": True}, {"num_reg_tokens": 4},
                                {"class_token": False, "global_pool": "avg"}],
                         ids=["cls", "distilled", "registers", "no-class-token"])
def test_maps_land_on_the_right_patch_for_any_prefix_and_non_square_input(kw):
    m = tiny(**kw)
    P = m.num_prefix_tokens
    x = images(h=32, w=48)  # a 4 x 6 grid
    r, c = 2, 5
    handles = force_attention(m, one_hot_to(P + r * 6 + c))
    try:
        amap, _ = attention_rollout(m, x)
        heads, _ = cls_attention(m, x)
    finally:
        for h in handles:
            h.remove()
    assert amap.shape == (2, 4, 6) and heads.shape == (2, 4, 4, 6)
    # the class row keeps no patch mass off target; without a class token each patch row keeps its
    # own identity share 0.5**depth, spread as 0.5**3 / 24 over the other patches by the row mean
    off_target = 0.0 if m.cls_token is not None else 0.5**3 / 24
    for t, other in ((amap, off_target), (heads[:, 1], 0.0)):
        flat = t.flatten(1)
        assert (flat.argmax(1) == r * 6 + c).all()
        rest = torch.cat([flat[:, :r * 6 + c], flat[:, r * 6 + c + 1:]], dim=1)
        assert torch.allclose(rest, torch.full_like(rest, other), atol=1e-7)


# ---------------------------------------------------------------- gradient rollout
def test_grad_rollout_matches_autograd_reference_and_leaves_no_state():
    m = tiny(sharp=3.0)
    x = images(n=2)
    target = torch.tensor([1, 3])
    amap, _, tgt = grad_rollout(m, x, target)
    assert amap.shape == (2, 4, 4) and (amap >= 0).all() and torch.equal(tgt, target)
    # independent route: capture the probabilities with hooks, torch.autograd.grad per sample
    for b in range(2):
        caught = []
        handles = [blk.attn.attn_map.register_forward_hook(lambda mod, inp, out, c=caught: c.append(out))
                   for blk in m.blocks]
        for blk in m.blocks:
            blk.attn.fused = False
        try:
            y = m(x[b:b + 1])
            grads = torch.autograd.grad(y[0, target[b]], caught)
        finally:
            for h in handles:
                h.remove()
            for blk in m.blocks:
                blk.attn.fused = True
        fused = [(g * a).clamp(min=0)[0].detach().double().tolist() for g, a in zip(grads, caught)]
        ref = reference_rollout(fused, "mean")
        assert torch.allclose(amap[b].flatten().double(), ref[0, 1:], atol=1e-6)
    assert all(not blk.attn.attn_map._forward_hooks for blk in m.blocks)
    assert all(blk.attn.fused for blk in m.blocks)
    assert all(p.grad is None for p in m.parameters())  # no gradients accumulated on the weights
    other, _, _ = grad_rollout(m, x, torch.tensor([0, 0]))
    assert not torch.allclose(other, amap)  # the class matters


def test_grad_rollout_works_with_frozen_parameters():
    m = tiny()
    m.requires_grad_(False)
    amap, _, tgt = grad_rollout(m, images(n=1))
    assert amap.shape == (1, 4, 4) and torch.isfinite(amap).all() and tgt.shape == (1,)


# ---------------------------------------------------------------- mean attention distance
def grid_mean_pairwise_distance(gh, gw, patch):
    cells = list(itertools.product(range(gh), range(gw)))
    total = sum(math.hypot(a[0] - b[0], a[1] - b[1]) for a in cells for b in cells)
    return patch * total / len(cells) ** 2


def test_attention_forced_to_diagonal_has_zero_distance():
    m = tiny()
    handles = force_attention(m, lambda out: torch.eye(out.shape[-1]).expand_as(out).clone())
    try:
        d = model_attention_distance(m, images(h=32, w=48))
    finally:
        for h in handles:
            h.remove()
    assert d.shape == (2, 3, 4)
    assert d.abs().max() == 0


@pytest.mark.parametrize("kw,hw", [({"class_token": False, "global_pool": "avg"}, (32, 48)), ({}, (40, 24))])
def test_uniform_attention_distance_is_the_grids_mean_pairwise_distance(kw, hw):
    m = uniform(tiny(**kw))
    gh, gw = hw[0] // 8, hw[1] // 8
    d = model_attention_distance(m, images(h=hw[0], w=hw[1]))
    N, T = gh * gw, gh * gw + m.num_prefix_tokens
    # prefix columns are dropped without renormalising: patches hold N/T of each uniform row
    expected = grid_mean_pairwise_distance(gh, gw, 8) * N / T
    assert torch.allclose(d, torch.full_like(d, expected), rtol=1e-5)


# ---------------------------------------------------------------- object mass
def test_object_mass_on_a_synthetic_object():
    raw = torch.zeros(3, 3, 32, 32)
    raw[:, :, 8:24, 0:16] = 0.9  # the object: 16x16 of 32x32 pixels, patches (1..2, 0..1)
    m = uniform(tiny())
    res = object_mass(m, raw, background_threshold=0.1)
    assert res["share"] == pytest.approx(0.25) and res["mass"] == pytest.approx(0.25, abs=1e-6)
    assert res["lift"] == pytest.approx(1.0, abs=1e-5) and res["n"] == 3
    m = tiny()
    handles = force_attention(m, one_hot_to(1 + 1 * 4 + 0))  # all attention on patch (1, 0): inside
    try:
        inside = object_mass(m, raw, 0.1)
        mask = torch.zeros(3, 32, 32, dtype=torch.bool)
        mask[:, 0:8, 24:32] = True  # an explicit mask elsewhere: patch (0, 3)
        outside = object_mass(m, raw, mask=mask)
    finally:
        for h in handles:
            h.remove()
    assert inside["mass"] == pytest.approx(1.0, abs=1e-6) and inside["lift"] == pytest.approx(4.0, abs=1e-4)
    assert outside["mass"] == pytest.approx(0.0, abs=1e-6) and outside["share"] == pytest.approx(1 / 16)


@pytest.mark.parametrize("method", ["rollout", "cls-attention", "grad-rollout"])
def test_explain_equals_the_single_methods_in_one_forward(method):
    m, x = tiny(sharp=3.0), images(n=2, h=32, w=48)
    calls = []
    handle = m.register_forward_hook(lambda mod, inp, out: calls.append(1))
    try:
        amap, logits, heads = explain(m, x, method, target=2 if method == "grad-rollout" else None,
                                      head_fusion="max", discard_ratio=0.25)
    finally:
        handle.remove()
    assert len(calls) == 1  # grad-rollout included: the head maps come from the same pass as the gradient
    if method == "rollout":
        want, want_logits = attention_rollout(m, x, "max", 0.25)
    elif method == "cls-attention":
        per_head, want_logits = cls_attention(m, x)
        want = per_head.amax(dim=1)
    else:
        want, want_logits, target = grad_rollout(m, x, 2, discard_ratio=0.25)
        assert target.tolist() == [2, 2]
    assert amap.shape == (2, 4, 6) and torch.allclose(amap, want, atol=1e-6)
    assert torch.allclose(logits, want_logits, atol=1e-5)
    assert torch.allclose(heads, cls_attention(m, x)[0], atol=1e-6)


# ---------------------------------------------------------------- figures
def test_figures_leave_the_matplotlib_backend_alone(tmp_path):
    import matplotlib
    from PIL import Image

    from vitkit.analysis.figures import distance_figure, overlay_figure
    from vitkit.training.report import plot_curves

    before = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend that is not Agg, as a notebook's or a GUI's would be
    try:
        distance_figure(torch.rand(3, 4) * 20, tmp_path / "distance.png", "title", image_extent=32)
        overlay_figure(torch.rand(3, 32, 32), torch.rand(4, 4), tmp_path / "overlay.png", "title", "caption")
        plot_curves([{"epoch": e, "train_loss": 1.0 / e, "eval_loss": 1.2 / e, "eval_split": "val",
                      "eval_top1": 50.0 + e} for e in (1, 2, 3)], tmp_path / "curves.png")
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(before)
    for name, size in (("distance", (700, 450)), ("overlay", (800, 450)), ("curves", (1000, 400))):
        with Image.open(tmp_path / f"{name}.png") as im:
            assert im.format == "PNG" and im.size == size


# ---------------------------------------------------------------- embeddings
def test_patch_filter_components_match_sklearn_pca():
    from sklearn.decomposition import PCA

    m = tiny()
    comps, ratio = patch_filter_components(m, k=6)
    w = m.patch_embed.proj.weight.detach().reshape(32, -1).double().numpy()
    pca = PCA(n_components=6).fit(w)
    ours = comps.reshape(6, -1).double().numpy()
    for i in range(6):
        assert abs(abs(float(np.dot(ours[i], pca.components_[i]))) - 1) < 1e-4  # same axis, any sign
    assert np.allclose(ratio.numpy(), pca.explained_variance_ratio_, atol=1e-5)
    assert comps.shape == (6, 3, 8, 8)
    assert patch_filter_components(m, k=500)[0].shape[0] == 32  # capped at the number of filters


def test_pos_embed_similarity_learned_sincos_none():
    m = tiny(img_size=(32, 48), num_reg_tokens=2)
    s = pos_embed_similarity(m)
    assert s.shape == (4, 6, 4, 6)
    table = torch.nn.functional.normalize(m.pos_embed[0, 3:].detach(), dim=-1)
    assert torch.allclose(s[1, 2, 3, 4], table[1 * 6 + 2] @ table[3 * 6 + 4], atol=1e-6)
    assert torch.allclose(torch.diagonal(s.reshape(24, 24)), torch.ones(24), atol=1e-6)
    sincos = pos_embed_similarity(tiny(pos_embed="sincos", embed_dim=64))
    assert sincos[0, 0, 0, 1] > sincos[0, 0, 3, 3]  # fixed tables are local: neighbours are closer
    assert pos_embed_similarity(tiny(pos_embed="none")) is None


def test_token_map_of_head_tensor_keeps_heads():
    m = tiny(distilled=True)
    joint = torch.rand(2, 4, 18, 18)
    assert torch.equal(token_map(m, joint, (4, 4)), joint[:, :, 0, 2:].reshape(2, 4, 4, 4))


# ---------------------------------------------------------------- peer checkpoint
def test_attention_of_an_imported_timm_checkpoint_matches_timm(tmp_path):
    import timm
    from safetensors.torch import save_file

    import vitkit

    torch.manual_seed(0)
    peer = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2,
                             num_heads=4, num_classes=5, reg_tokens=2, no_embed_class=True,
                             dynamic_img_size=True).eval()
    save_file(peer.state_dict(), tmp_path / "peer.safetensors")
    # a bare timm state dict does not say its head count (inference assumes width / 64): state it
    ours = vitkit.load_model(tmp_path / "peer.safetensors", num_heads=4).eval()
    assert ours.num_prefix_tokens == 3 and ours.cfg.num_heads == 4
    caught = []
    for blk in peer.blocks:
        blk.attn.fused_attn = False  # timm's eager path; its probabilities enter attn_drop
        blk.attn.attn_drop.register_forward_hook(lambda mod, inp, out: caught.append(inp[0]))
    x = images(n=2, h=32, w=40)  # non-square: both resample the position table per call
    with torch.no_grad():
        peer_logits = peer(x)
    logits, attns = attention_weights(ours, x)
    assert torch.allclose(logits, peer_logits, atol=1e-5)
    for a, b in zip(attns, caught):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(rollout_matrix(attns), rollout_matrix(caught), atol=1e-6)


# ---------------------------------------------------------------- explain inputs and heat-map figures
def _has_colour(rgb: np.ndarray, colour, tol: int = 12) -> bool:
    return bool((np.abs(rgb.astype(int) - np.array(colour)).max(-1) <= tol).any())


@pytest.mark.parametrize("figure", ["overlay", "heads"])
def test_heat_maps_have_a_colour_bar(tmp_path, figure):
    """The ends of 'jet' at full opacity, dark blue (0, 0, 128) and dark red (128, 0, 0), can only come from
    a colour bar: over a light gray image (>= 0.5) the overlay (alpha <= 0.6) keeps every channel >= 51."""
    import skimage.data
    from PIL import Image

    from vitkit.analysis.figures import head_grid_figure, overlay_figure

    gray = 0.5 + torch.from_numpy(skimage.data.camera()[::8, ::8] / 510.0).float()[None].repeat(3, 1, 1)
    amap = torch.rand(4, 4, generator=torch.Generator().manual_seed(0))
    path = tmp_path / f"{figure}.png"
    if figure == "overlay":
        overlay_figure(gray, amap, path, "title", "caption")
    else:
        head_grid_figure(gray, torch.stack([amap, amap.T, 1 - amap]), path, "title")
    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"))
    assert _has_colour(rgb, (0, 0, 128)) and _has_colour(rgb, (128, 0, 0))


def test_explain_input_is_the_eval_crop_not_a_squashed_photo():
    """`explain` (analysis.inputs.prepare) feeds the model what predict does: timm's eval transform, the shorter
    side resized and centre-cropped; the overlay's pixels are that crop, not the photo squashed to a square."""
    import skimage.data
    from PIL import Image
    from timm.data import create_transform, resolve_data_config

    from vitkit.analysis.inputs import prepare

    torch.manual_seed(0)
    model = tiny().eval()  # 32x32 input, bicubic, crop_pct 0.9 (the ViT default)
    pre = model.preprocess
    photo = Image.fromarray(skimage.data.chelsea())  # 451 x 300
    for size in (None, (32, 48)):
        hw = size or tuple(pre.input_size[1:])
        cfg = resolve_data_config({"input_size": (3, *hw), "crop_pct": pre.crop_pct, "interpolation": pre.interpolation,
                                   "mean": pre.mean, "std": pre.std})
        expect = create_transform(**cfg)(photo)
        x, raw = prepare(model, photo, size)
        assert x.shape == (1, 3, *hw) and (x[0] - expect).abs().max() <= 1e-5
        unnorm = expect * torch.tensor(pre.std)[:, None, None] + torch.tensor(pre.mean)[:, None, None]
        assert (raw - unnorm).abs().max() <= 1e-5
    gray_model = tiny(in_chans=1).eval()
    x, raw = prepare(gray_model, photo)
    assert x.shape == (1, 1, 32, 32) and raw.shape == (1, 32, 32)
