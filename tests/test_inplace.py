"""In-place inference (layers/inplace.py, the `inplace_inference` decision): the same values bit for bit as timm's
out-of-place path, the caller's tensors and what hooks keep left alone, and timm's path wherever anything could
see the overwrite (grad, autocast, hooks)."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vitkit
from vitkit.hardware import Capabilities, apply_fast_paths, decide
from vitkit.layers.block import Block
from vitkit.layers.mlp import DepthwiseConvMlp, Mlp

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, mlp_ratio=2.0)


def _switch(model: torch.nn.Module, on: bool) -> int:
    n = 0
    for m in model.modules():
        if isinstance(getattr(m, "inplace_inference", None), bool):
            m.inplace_inference, n = on, n + 1
    return n


def _model(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    m = vitkit.create_model("vit_tiny_patch16_224", num_classes=7, **(TINY | kw)).eval()
    for p in m.parameters():  # the head and LayerScale start at zero or tiny: every part should move the output
        p.data.add_(torch.randn_like(p) * 0.1)
    return m


@pytest.mark.parametrize("kw", [{}, {"init_values": 0.1}, {"mlp_layer": "mlp_dwconv"}, {"act": "gelu_tanh"},
                                {"num_reg_tokens": 2}, {"post_norm": True}])
def test_the_same_values_bit_for_bit_and_the_input_is_left_alone(kw):
    m = _model(**kw)
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        _switch(m, False)
        want_logits, want_inter = m(x), m.forward_intermediates(x, indices=3, intermediates_only=True)
        assert _switch(m, True) >= 2 * 3  # every block and its MLP
        tokens = torch.randn(2, m.num_prefix_tokens + 16, 32)  # [B, P + N, D] on a 4 x 4 grid
        before = tokens.clone()
        m.blocks[0](tokens, grid=(4, 4))
        assert torch.equal(tokens, before)  # a block never writes into its input
        got_logits, got_inter = m(x), m.forward_intermediates(x, indices=3, intermediates_only=True)
    assert torch.equal(got_logits, want_logits)
    assert all(torch.equal(a, b) for a, b in zip(got_inter, want_inter))  # kept intermediates are not overwritten


def test_it_runs_and_matches_under_no_grad_too():
    m = _model()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        want = m(x)
        _switch(m, True)
        assert torch.equal(m(x), want)


class _InplaceOps(TorchDispatchMode):
    """Counts the in-place adds and GELUs a forward runs."""

    def __init__(self):
        super().__init__()
        self.count = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.add_.Tensor, torch.ops.aten.gelu_.default):
            self.count[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _inplace_ops(m, x) -> Counter:
    with torch.inference_mode(), _InplaceOps() as ops:
        m(x)
    return ops.count


def test_hooks_keep_what_they_saw():
    """A hook on the attention, the MLP or fc1 keeps a tensor the in-place sum or GELU would overwrite: there the
    block (or MLP) runs timm's path, so what the hook kept is what timm's path gives. A hook on a block itself sees
    its output, which nothing overwrites: that block stays in place."""
    m = _model(depth=4)
    x = torch.randn(1, 3, 32, 32)
    assert not _inplace_ops(m, x)  # switched off: timm's out-of-place ops only
    _switch(m, True)
    assert _inplace_ops(m, x) == {"add_": 2 * 4, "gelu_": 4}  # every block: two sums, one GELU
    kept: dict[str, list[torch.Tensor]] = {"attn": [], "mlp": [], "block": [], "fc1": []}
    hooks = [m.blocks[0].attn.register_forward_hook(lambda mod, i, o: kept["attn"].append(o)),
             m.blocks[1].mlp.register_forward_hook(lambda mod, i, o: kept["mlp"].append(o)),
             m.blocks[2].register_forward_hook(lambda mod, i, o: kept["block"].append(o)),
             m.blocks[3].mlp.fc1.register_forward_hook(lambda mod, i, o: kept["fc1"].append(o))]
    # blocks 0 and 1 add out of place (a hook inside), their MLPs' GELUs stay in place (no hook inside those);
    # block 2 stays in place; block 3 and its MLP take timm's path
    assert _inplace_ops(m, x) == {"add_": 2, "gelu_": 3}
    _switch(m, False)
    with torch.inference_mode():
        m(x)
    for h in hooks:
        h.remove()
    for name, (on, off) in ((k, v[-2:]) for k, v in kept.items()):
        assert torch.equal(off, on), name


def test_training_and_autocast_take_timms_path():
    m = _model()
    _switch(m, True)
    x = torch.randn(2, 3, 32, 32)
    m.train()
    m(x).sum().backward()  # under grad nothing is overwritten: autograd keeps what it saved
    got = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    _switch(m, False)
    m(x).sum().backward()
    assert all(torch.equal(a, p.grad) for a, p in zip(got, m.parameters()))
    m.eval()
    with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
        want = m(x)
        _switch(m, True)
        assert torch.equal(m(x), want)


def test_the_decision_reaches_blocks_and_mlps_and_is_off_by_the_rules():
    m = _model(mlp_layer="mlp_dwconv")
    assert not decide(Capabilities(avx2=True)).inplace_inference  # no rule: timm's path where nothing measured
    on = decide(Capabilities(avx2=True), measured={"date": "d", "ratios": {"inplace_inference": 1.05}})
    off = decide(Capabilities(avx2=True), measured={"date": "d", "ratios": {"inplace_inference": 1.01}})
    assert on.inplace_inference and not off.inplace_inference and "measured here" in on.why["inplace_inference"]
    counts = apply_fast_paths(m, on)
    assert counts["inplace_inference"] == 2 * len(m.blocks)
    assert all(b.inplace_inference and b.mlp.inplace_inference for b in m.blocks)
    assert isinstance(m.blocks[0], Block) and isinstance(m.blocks[0].mlp, DepthwiseConvMlp)
    apply_fast_paths(m, off)
    assert not any(getattr(x, "inplace_inference", False) for x in m.modules())
    assert Mlp.inplace_inference is False and Block.inplace_inference is False  # layers default to timm's path
