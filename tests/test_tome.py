"""Token merging (ToMe): the matching and merging against a transcription of facebookresearch/ToMe, a whole ViT
against ToMe's patched timm ViT, R=0 bit-identical to the plain model, the cost per block, and bad input."""
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.analysis.cost import model_cost
from vitkit.cli.main import main
from vitkit.errors import ConfigError
from vitkit.layers.tome import TokenMatch, merge_wavg, tokens_per_block
from vitkit.peers import timm_twin

# 64 patches of 4x4 on 32 px: each of 4 blocks can merge up to 32
TINY = dict(embed_dim=64, depth=4, num_heads=4, img_size=32, patch_size=4, num_classes=7)


# ---------------------------------------------------------------------------- the reference
# A faithful transcription of facebookresearch/ToMe (tome/merge.py: bipartite_soft_matching, merge_wavg;
# tome/patch/timm.py: ToMeBlock.forward, ToMeAttention.forward), commit of 2023, trimmed of what these tests do
# not use (unmerge, source tracing). THIS IS THE REFERENCE, not vitkit code.
def tome_bipartite_soft_matching(metric, r, class_token=False, distill_token=False):
    protected = 0
    if class_token:
        protected += 1
    if distill_token:
        protected += 1
    t = metric.shape[1]
    r = min(r, (t - protected) // 2)
    if r <= 0:
        return lambda x, mode=None: x
    with torch.no_grad():
        metric = metric / metric.norm(dim=-1, keepdim=True)
        a, b = metric[..., ::2, :], metric[..., 1::2, :]
        scores = a @ b.transpose(-1, -2)
        if class_token:
            scores[..., 0, :] = -math.inf
        if distill_token:
            scores[..., :, 0] = -math.inf
        node_max, node_idx = scores.max(dim=-1)
        edge_idx = node_max.argsort(dim=-1, descending=True)[..., None]
        unm_idx = edge_idx[..., r:, :]
        src_idx = edge_idx[..., :r, :]
        dst_idx = node_idx[..., None].gather(dim=-2, index=src_idx)
        if class_token:
            unm_idx = unm_idx.sort(dim=1)[0]

    def merge(x, mode="mean"):
        src, dst = x[..., ::2, :], x[..., 1::2, :]
        n, t1, c = src.shape
        unm = src.gather(dim=-2, index=unm_idx.expand(n, t1 - r, c))
        src = src.gather(dim=-2, index=src_idx.expand(n, r, c))
        dst = dst.scatter_reduce(-2, dst_idx.expand(n, r, c), src, reduce=mode)
        if distill_token:
            return torch.cat([unm[:, :1], dst[:, :1], unm[:, 1:], dst[:, 1:]], dim=1)
        return torch.cat([unm, dst], dim=1)

    return merge


def tome_merge_wavg(merge, x, size=None):
    if size is None:
        size = torch.ones_like(x[..., 0, None])
    x = merge(x * size, mode="sum")
    size = merge(size, mode="sum")
    x = x / size
    return x, size


def tome_block_forward(self, x):  # ToMeBlock.forward
    attn_size = self._tome_info["size"] if self._tome_info["prop_attn"] else None
    x_attn, metric = tome_attention_forward(self.attn, self.norm1(x), attn_size)
    x = x + self.drop_path1(x_attn)
    r = self._tome_info["r"].pop(0)
    if r > 0:
        merge = tome_bipartite_soft_matching(metric, r, self._tome_info["class_token"],
                                             self._tome_info["distill_token"])
        x, self._tome_info["size"] = tome_merge_wavg(merge, x, self._tome_info["size"])
    x = x + self.drop_path2(self.mlp(self.norm2(x)))
    return x


def tome_attention_forward(self, x, size=None):  # ToMeAttention.forward
    B, N, C = x.shape
    qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = (q @ k.transpose(-2, -1)) * self.scale
    if size is not None:
        attn = attn + size.log()[:, None, None, :, 0]
    attn = attn.softmax(dim=-1)
    attn = self.attn_drop(attn)
    x = (attn @ v).transpose(1, 2).reshape(B, N, C)
    x = self.proj(x)
    x = self.proj_drop(x)
    return x, k.mean(1)


def tome_patched_timm(model, r: int):
    """ToMe's apply_patch on vitkit's timm twin (the same weights): blocks forward as ToMeBlock, r per block as
    ToMe's parse_r gives for an int (the same r for every block)."""
    twin = timm_twin(model).eval()
    info = {"size": None, "prop_attn": True, "class_token": twin.cls_token is not None, "distill_token": False}
    for blk in twin.blocks:
        blk._tome_info = info
        blk.forward = tome_block_forward.__get__(blk)
    original_forward = twin.forward

    def forward(x):
        info["r"], info["size"] = [r] * len(twin.blocks), None
        return original_forward(x)

    twin.forward = forward
    return twin, info


# ---------------------------------------------------------------------------- matching and merging
@pytest.mark.parametrize("prefix,tokens,r", [(0, 50, 12), (1, 65, 20), (2, 66, 16), (1, 9, 4)])
def test_matching_and_weighted_merge_equal_tome(prefix, tokens, r):
    torch.manual_seed(prefix * 100 + tokens)
    metric, x = torch.randn(3, tokens, 16), torch.randn(3, tokens, 24)
    theirs = tome_bipartite_soft_matching(metric.clone(), r, class_token=prefix >= 1, distill_token=prefix == 2)
    ours = TokenMatch(metric.clone(), r, prefix)
    assert torch.equal(ours(x, mode="sum"), theirs(x, mode="sum"))  # the same tokens, merged into the same places
    size = None
    ref_x, ref_size = x, None
    for _ in range(2):  # twice, so the second merge averages with sizes from the first
        x, size = merge_wavg(TokenMatch(metric[:, : x.shape[1]], r // 2, prefix), x, size)
        ref_x, ref_size = tome_merge_wavg(tome_bipartite_soft_matching(
            metric[:, : ref_x.shape[1]], r // 2, prefix >= 1, prefix == 2), ref_x, ref_size)
        torch.testing.assert_close(x, ref_x, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(size, ref_size, atol=0, rtol=0)
    assert x.shape[1] == tokens - 2 * (r // 2) and size.sum(1).eq(tokens).all()


def test_registers_stay_in_front_unmerged():
    torch.manual_seed(1)
    metric, x = torch.randn(2, 41, 8), torch.randn(2, 41, 8)
    merged, size = merge_wavg(TokenMatch(metric, 10, prefix=5), x)  # class + 4 registers
    assert torch.equal(merged[:, :5], x[:, :5]) and size[:, :5].eq(1).all()
    assert merged.shape == (2, 31, 8) and size.sum(1).eq(41).all()


# ---------------------------------------------------------------------------- the whole model
def tiny(**kw):
    torch.manual_seed(0)
    model = vitkit.VisionTransformer(vitkit.ViTConfig(**(TINY | kw))).eval()
    with torch.no_grad():  # weights big enough that tokens differ clearly (no near-ties in the matching)
        for p in model.parameters():
            p.normal_(0, 0.3) if p.ndim > 1 else p.normal_(0, 0.1)
    return model


def test_vit_with_merging_equals_tome_patched_timm():
    model = tiny(merge=6)
    twin, _ = tome_patched_timm(model, 6)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), atol=1e-5, rtol=1e-5)
        eager, maps = model(x, return_attn=True)  # the eager path: same result, attention over fewer tokens
        torch.testing.assert_close(eager, twin(x), atol=1e-5, rtol=1e-5)
    counts = tokens_per_block(65, 1, 6, 4)
    assert [m.shape[-1] for m in maps] == counts[:-1] == [65, 59, 53, 47]
    assert model.forward_features(x).shape == (4, counts[-1], 64)


def test_average_pooling_weights_merged_tokens_by_size():
    """Mean pooling over merged tokens weights each by its size (ToMe's MAE patch: sum(x * size) / patches)."""
    model = tiny(merge=6, global_pool="avg")
    twin, info = tome_patched_timm(model, 6)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        info["r"], info["size"] = [6] * 4, None
        tokens = twin.forward_features(x)
        pooled = (tokens * info["size"])[:, 1:].sum(dim=1) / 64
        torch.testing.assert_close(model(x), twin.head(twin.fc_norm(pooled)), atol=1e-5, rtol=1e-5)


def test_merge_zero_is_bit_identical_to_the_plain_model():
    plain, zero = tiny(), tiny(merge=0)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(plain(x), zero(x))
        (a, maps_a), (b, maps_b) = plain(x, return_attn=True), zero(x, return_attn=True)
        assert torch.equal(a, b) and all(torch.equal(p, q) for p, q in zip(maps_a, maps_b))
        assert not torch.equal(plain(x), tiny(merge=6)(x))


def test_create_and_load_with_merge(tmp_path):
    model = vitkit.create_model("vit_small_patch4_32", depth=2, merge=8).eval()
    path = vitkit.save_model(vitkit.create_model("vit_small_patch4_32", depth=2), tmp_path / "m.safetensors")
    loaded = vitkit.load_model(path, merge=8).eval()
    loaded.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert loaded.cfg.merge == 8 and torch.equal(loaded(x), model(x))
        assert model.forward_features(x).shape[1] == 65 - 16


def test_grad_checkpointing_keeps_merged_gradients():
    model = tiny(merge=6).train()
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for g, p in zip(plain, model.parameters()):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------------- cost
def test_cost_counts_tokens_per_block_and_macs_of_the_merged_model():
    model = vitkit.create_model("vit_small_patch4_32", depth=3, merge=10).eval()
    r = model_cost(model, batch=2)
    assert r.tokens_per_block == tokens_per_block(65, 1, 10, 3) == [65, 55, 45, 35]
    assert r.macs_total < model_cost("vit_small_patch4_32", depth=3, batch=2).macs_total
    for blk in model.blocks:
        blk.attn.fused = False  # eager: QK^T and AV are bmm calls the counter sees
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    assert counter.get_total_flops() == 2 * r.macs_total  # the matching's similarity matmul included


def test_cost_cli_reports_tokens_per_block(capsys):
    assert main(["cost", "S/16", "--merge", "13"]) == 0
    out = capsys.readouterr().out
    assert "197 > 184 > 171" in out and "> 41" in out
    assert main(["cost", "S/16", "--merge", "13", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    assert report["tokens_per_block"] == tokens_per_block(197, 1, 13, 12) and report["merge"] == 13


# ---------------------------------------------------------------------------- bad input
def test_too_many_tokens_refused_in_one_line(capsys):
    with pytest.raises(ConfigError, match=r"merge=99: token merging takes 0 to 98 tokens per block for 196") as e:
        vitkit.create_model("vit_small_patch16_224", merge=99)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="0 to 32"):
        tiny(merge=-1)
    model = tiny(merge=20)  # valid at 32 px (64 patches), not at 16 px (16 patches: at most 8)
    with pytest.raises(ConfigError, match="0 to 8 tokens per block for 16 patch tokens"):
        model(torch.randn(1, 3, 16, 16))
    assert main(["cost", "S/16", "--merge", "200"]) != 0
    err = capsys.readouterr().err.strip()
    assert "0 to 98" in err and len(err.splitlines()) == 1


def test_models_without_mergeable_tokens_refused_in_one_line():
    with pytest.raises(ConfigError, match="token merging .* ViT") as e:
        vitkit.create_model("resnet18", merge=8)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="rotary"):
        tiny(merge=4, rope="axial", pos_embed="none")
    with pytest.raises(ConfigError, match="dense"):
        tiny(merge=4).forward_intermediates(torch.randn(1, 3, 32, 32))
