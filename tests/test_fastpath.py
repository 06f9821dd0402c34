"""The speed paths compute what the plain path computes: the bf16 matmul attention, the fused native
encoder-layer kernel for bf16 inference, torch.compile, and the `vitkit bench` harness that times them."""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.bench import infer_fn
from vitkit.cli.main import main
from vitkit.peers import check_twin, timm_twin


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_tiny_patch16_224", depth=4).eval()
    return model, timm_twin(model).eval()


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.float().flatten(), b.float().flatten(), dim=0).item()


def test_fp32_inference_equals_timm(pair, photo_batch):
    model, twin = pair
    x = photo_batch(224)
    with torch.inference_mode():
        assert (model(x) - twin(x)).abs().max() <= 1e-4


def test_bf16_paths_close_to_fp32_and_to_timm_bf16(pair, photo_batch):
    model, twin = pair
    x = photo_batch(224)
    # the matmul form's numbers, whatever this machine decided for it (vitkit.hardware turns it off where bf16
    # is emulated, as on an AVX2-only Zen 3): a copy with the switch on, so the path under test really runs
    model = copy.deepcopy(model)
    for b in model.blocks:
        b.attn.matmul_attention = True
    matmul_attention = []  # AttentionMap only runs on the matmul path (SDPA never forms the matrix)
    hooks = [b.attn.attn_map.register_forward_hook(lambda m, i, o: matmul_attention.append(o.dtype))
             for b in model.blocks]
    try:
        with torch.inference_mode():
            ref = model(x)
            assert matmul_attention == []  # fp32: fused SDPA
            with torch.autocast("cpu", torch.bfloat16):
                auto, twin_auto = model(x), twin(x)
            assert matmul_attention == [torch.bfloat16] * len(model.blocks)  # bf16 on CPU: the matmul attention ran
    finally:
        for h in hooks:
            h.remove()
    with torch.inference_mode():
        weights = copy.deepcopy(model).to(torch.bfloat16)(x.to(torch.bfloat16))
    for out in (auto, weights):
        assert _cos(out, ref) > 0.995 and (out.float() - ref).abs().max() < 0.1 * ref.abs().max()
    assert _cos(auto, twin_auto) > 0.995


def test_native_block_fastpath_equals_module_path(pair, photo_batch):
    model = pair[0]
    with torch.no_grad():
        x = model.embed(photo_batch(224)).to(torch.bfloat16)  # [3, 197, 192]
    bf16 = copy.deepcopy(model.blocks[0]).to(torch.bfloat16)
    with torch.inference_mode():
        assert bf16._fastpath_applies(x)
        fast = bf16(x)
        bf16.native_fastpath = False
        plain = bf16(x)
        with torch.autocast("cpu", torch.bfloat16):
            assert not bf16._fastpath_applies(x)
    assert (fast.float() - plain.float()).abs().max() <= 0.05 * plain.float().abs().max()
    assert _cos(fast, plain) > 0.9999
    assert not bf16._fastpath_applies(x)  # grad enabled
    bf16.native_fastpath = True
    with torch.inference_mode():
        assert not bf16._fastpath_applies(x.float())  # fp32 keeps the module path (no faster there)
        seen = []
        handle = bf16.mlp.fc1.register_forward_hook(lambda m, i, o: seen.append(o.shape))
        assert not bf16._fastpath_applies(x)  # a hook waits on a submodule
        bf16(x)
        handle.remove()
        assert seen == [torch.Size([3, 197, 768])]
        bf16.train()
        assert not bf16._fastpath_applies(x)


def test_return_attn_and_attn_map_hook_still_work_in_bf16(pair, photo_batch):
    model = pair[0]
    seen = []
    handle = model.blocks[1].attn.attn_map.register_forward_hook(lambda m, i, o: seen.append(o))
    try:
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16):
            _, attns = model(photo_batch(224), return_attn=True)
    finally:
        handle.remove()
    assert len(attns) == 4 and attns[0].shape == (3, 3, 197, 197)
    assert torch.allclose(attns[1].float().sum(-1), torch.ones(3, 3, 197), atol=2e-2)
    assert seen and seen[0] is attns[1]


def test_bf16_training_gradients_match_timm(pair, photo_batch):
    """The matmul attention's backward (used in bf16 on CPU) against timm's SDPA backward."""
    model, twin = pair
    x, y = photo_batch(224), torch.tensor([1, 2, 3])
    grads = []
    for net in (model, twin):
        net.train().zero_grad()
        with torch.autocast("cpu", torch.bfloat16):
            F.cross_entropy(net(x), y).backward()
        grads.append(torch.cat([p.grad.flatten() for p in net.parameters()]))
        net.zero_grad()
        net.eval()
    assert _cos(grads[0], grads[1]) > 0.99


def test_compile_backend_sets_inductor_freezing_for_its_compile_only():
    import torch._inductor.config as inductor_config

    torch.manual_seed(0)
    model, x = vitkit.create_model("vit_pico_patch2_8").eval(), torch.randn(4, 1, 8, 8)
    before = inductor_config.freezing
    compiled = infer_fn(model, x, "fp32", "compile")()
    assert inductor_config.freezing == before  # not left switched on for the rest of the process
    with torch.inference_mode():
        assert (compiled - model(x)).abs().max() <= 1e-4


def test_bench_quick_json_runs_and_parses(capsys):
    threads = torch.get_num_threads()
    assert main(["bench", "--quick", "--threads", str(threads + 1), "--json"]) == 0
    assert torch.get_num_threads() == threads  # --threads holds for the run only
    report = json.loads(capsys.readouterr().out)
    assert report["machine"]["threads"] == threads + 1
    assert set(report["matmul_peak_gflops"]) == {"fp32", "bf16"}
    assert report["machine"]["torch"] == torch.__version__ and report["date"]
    rows = report["rows"]
    assert {(r["task"], r["library"]) for r in rows} >= {("infer", "vitkit"), ("infer", "timm"),
                                                         ("train", "vitkit"), ("train", "timm")}
    for r in rows:
        assert r["img_per_s"] > 0 and r["gflops"] > 0
        assert (r["vs_timm"] is None) == (r["library"] == "timm")


def test_bench_control_times_a_second_timm_model_in_the_same_rounds(capsys):
    from vitkit.bench import CONTROL, markdown

    assert main(["bench", "--quick", "--control", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["rows"]
    control = [r for r in rows if r["library"] == CONTROL]
    timm_rows = [r for r in rows if r["library"] == "timm" and r["backend"] == "eager"]
    # one control beside each timm eager case (inference per precision, training), compared with timm eager
    cases = sorted((r["task"], r["precision"]) for r in control)
    assert cases == sorted((r["task"], r["precision"]) for r in timm_rows)
    assert all(r["vs_timm_ref"] == "timm/eager" and r["vs_timm"] > 0 and r["vs_best_peer"] is None for r in control)
    assert all(CONTROL not in (r["best_peer"] or "") for r in rows if r["library"] == "vitkit")  # never a peer
    assert f"{CONTROL}: a second timm model" in markdown(report)
    assert main(["bench", "--quick", "--json"]) == 0  # off by default
    assert not [r for r in json.loads(capsys.readouterr().out)["rows"] if r["library"] == CONTROL]


def test_bench_peer_rows_openvino_direct_and_the_runner(tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    from vitkit.bench import BenchOptions, markdown, openvino_fn, run_benchmarks

    monkeypatch.setenv("VITKIT_MEASURE", "1")  # the runner measures its pick, as for a user
    opts = BenchOptions(models=("vit_pico_patch2_8",), batches=(2,), precisions=("fp32",),
                        backends=("eager", "openvino", "runner"), train_models=(), warmup=1, repeats=2, matmul_n=64)
    rows = run_benchmarks(opts)["rows"]
    keys = {(r["library"], r["backend"]) for r in rows}
    assert keys == {("vitkit", "eager"), ("timm", "eager"), ("openvino", "direct"), ("vitkit", "runner")}
    peers = {f"{r['library']}/{r['backend']}": r["ms"] for r in rows if r["library"] != "vitkit"}
    for r in rows:
        if r["library"] == "vitkit":  # each vitkit row against the fastest peer of the same run
            assert r["best_peer"] == min(peers, key=peers.get) and r["vs_best_peer"] > 0
        else:
            assert r["vs_best_peer"] is None and r["vs_timm"] is None
    (runner_row,) = [r for r in rows if r["backend"] == "runner"]
    assert runner_row["picked"] in ("torch/fp32", "openvino/fp32", "onnx/fp32")
    assert "| direct | openvino |" in markdown({"command": "c", "options": {}, "date": "d", "machine": {
        "cpu": "x", "cores": 2, "torch": "t", "threads": 2}, "clock": "wall", "warmup": 1, "repeats": 2,
        "matmul_gflops": {}, "rows": rows, "notes": ""})
    # the OpenVINO peer computes timm's outputs
    torch.manual_seed(0)
    twin = timm_twin(vitkit.create_model("vit_pico_patch2_8")).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert abs(openvino_fn(twin, x, "fp32")()[0] - twin(x).numpy()).max() <= 1e-4


def test_bench_without_timm_names_the_extra_to_install(capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "timm" or m.startswith("timm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "timm", None)  # what `import timm` meets when timm is not installed
    assert main(["bench", "--quick"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'vitkit[bench]'" in err


def test_bench_backends_compared_with_timm_eager_need_eager_in_one_line(capsys):
    """openvino, onnx and the runner are compared with timm eager: without eager the run stops at once with one
    line naming the fix, not with an internal KeyError after the first timings."""
    assert main(["bench", "--models", "vit_pico_patch2_8", "--backends", "openvino", "runner"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backends eager openvino runner" in err
    from vitkit.bench import BenchOptions

    assert BenchOptions(models=("vit_pico_patch2_8",), backends=("compile",)).backends == ("compile",)  # vs timm compile


def test_bench_refuses_a_model_without_a_timm_twin_before_timing(capsys, monkeypatch):
    """A conv-stem hybrid has no twin in timm's plain VisionTransformer: the run stops at once with one line,
    not after the inference rows have been timed (a measured row is never thrown away for a later model)."""
    import vitkit.bench as bench

    timed = []
    monkeypatch.setattr(bench, "matmul_rates", lambda *a, **k: timed.append(1) or {})
    assert main(["bench", "--models", "vit_tiny_patch16_224", "--train-models", "recipe:fashion-mnist-conv"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'conv_small' embedding" in err and "no twin" in err
    assert not timed


def test_a_twin_follows_what_the_model_declares_not_its_family_name():
    """check_twin asks the model for timm's keyword arguments: a ViT registered under another name still has
    its twin (equal outputs), a family without the method has none (one clear line)."""
    from vitkit.errors import ConfigError
    from vitkit.models.vision_transformer import VisionTransformer

    class RenamedViT(VisionTransformer):
        family = "renamed_vit"

    torch.manual_seed(0)
    plain = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32, patch_size=8)
    renamed = RenamedViT(plain.cfg)
    renamed.load_state_dict(plain.state_dict())
    check_twin(renamed)
    x = torch.rand(2, 3, 32, 32)
    with torch.inference_mode():
        assert torch.allclose(renamed.eval()(x), timm_twin(renamed).eval()(x), atol=1e-5)
    with pytest.raises(ConfigError, match="resnet model has no twin"):
        check_twin(vitkit.create_model("resnet18"))


def test_peak_fraction_is_left_out_where_the_reference_is_no_peak():
    from vitkit.bench import _peak_frac

    assert _peak_frac(50.0, 200.0, "eager") == 0.25
    assert _peak_frac(31.0, 0.29, "eager") is None  # emulated bf16: torch.mm ran slower than the model
    assert _peak_frac(50.0, 200.0, "onnx-int8") is None


def test_onednn_linear_equals_f_linear_with_gradients():
    from torch.utils.flop_counter import FlopCounterMode

    from vitkit.layers.mlp import Linear

    torch.manual_seed(0)
    lin, x = Linear(192, 576), torch.randn(2, 197, 192, requires_grad=True)
    lin.onednn = lin.onednn_training = True  # the switches vitkit.hardware sets (layers default to timm's path)
    weights = torch.randn(576)  # a loss that weighs outputs differently
    expect = F.linear(x, lin.weight, lin.bias)
    (expect * weights).sum().backward()
    ref = [t.grad.clone() for t in (x, lin.weight, lin.bias)]
    x.grad = None
    lin.zero_grad()
    out = lin(x)
    assert type(out.grad_fn).__name__ == "OneDnnLinearBackward"  # the oneDNN kernel in training
    lin.onednn_training = False  # decided apart (hardware.py): inference's switch alone leaves training on F.linear
    assert type(lin(x).grad_fn).__name__ != "OneDnnLinearBackward"
    lin.onednn_training = True
    (out * weights).sum().backward()
    assert (out - expect).abs().max() <= 1e-5
    for got, want in zip((x.grad, lin.weight.grad, lin.bias.grad), ref):
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
    with torch.no_grad():
        assert (lin(x) - expect).abs().max() <= 1e-5  # inference: the bare kernel
        with FlopCounterMode(display=False) as counter:
            lin(x)  # under a dispatch mode: the plain op, so FLOP counters see it
    assert counter.get_total_flops() == 2 * 2 * 197 * 192 * 576


def test_training_attention_switch_applies_under_grad_only_and_gives_the_same_gradients(monkeypatch):
    """`matmul_attention_training` (decided apart from inference: SDPA's CPU flash backward in bf16 measured 12x
    its fp32 time) picks the matmul form under grad only; forward and gradients match SDPA's."""
    from vitkit.layers.attention import Attention

    torch.manual_seed(0)
    attn = Attention(64, 4)
    attn.matmul_attention_training = True
    x = torch.randn(2, 10, 64)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or sdpa(*a, **k))

    def grads(bf16: bool):
        attn.zero_grad()
        with torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            out = attn(x)
        out.float().square().sum().backward()
        return out.float(), [p.grad.clone() for p in attn.parameters()]

    out, g = grads(True)  # bf16 under grad: the matmul form
    assert calls == []
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        attn(x)  # inference follows `matmul_attention` (off): SDPA
    assert calls == [1]
    attn.matmul_attention_training = False
    ref_out, ref_g = grads(True)
    assert len(calls) == 2
    assert _cos(out, ref_out) > 0.999 and all(_cos(a, b) > 0.99 for a, b in zip(g, ref_g))


def test_bench_matmul_rates_time_a_slow_kernel_once(monkeypatch):
    """A matmul-rate kernel whose first call takes longer than SLOW_MATMUL_S (emulated bf16 under an AVX2 cap: 44 s
    at n = 2048) is timed by that call alone; the others get their warm-up and `repeats` rounds."""
    from vitkit import bench

    calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda a, b: calls.append(a.dtype) or real_mm(a, b))
    rates = bench.matmul_rates(32, repeats=5)
    # the first call, a warm-up, then 5 rounds (a call this short repeats within a round)
    assert min(calls.count(torch.float32), calls.count(torch.bfloat16)) >= 1 + 1 + 5 and all(rates.values())
    calls.clear()
    monkeypatch.setattr(bench, "SLOW_MATMUL_S", 0.0)  # every kernel "slow": one call each
    rates = bench.matmul_rates(32, repeats=5)
    assert calls == [torch.float32, torch.bfloat16] and set(rates) >= {"fp32 torch.mm", "bf16 torch.mm"}
    assert all(r > 0 for r in rates.values())


def test_packed_linear_equals_f_linear_packs_once_and_follows_the_weight():
    """The `packed_linear` path (inference): the weight packed once per row count for its kernel, the numbers
    F.linear gives; a new row count packs again (at most PackCache.keep kept), an in-place change of the weight is
    seen, a copy starts with no packs, and grad, FLOP counters and bf16 autocast are what they are without it."""
    from torch.utils.flop_counter import FlopCounterMode

    import vitkit.onednn as onednn
    from vitkit.layers.mlp import Linear

    torch.manual_seed(0)
    lin = Linear(192, 576)
    lin.packed = True
    x = torch.randn(2, 197, 192)
    with torch.inference_mode():
        out = lin(x)
        cache = lin._packs
        (first,) = cache.packs.values()
        assert (out - F.linear(x, lin.weight, lin.bias)).abs().max() <= 1e-5
        assert torch.equal(lin(x), out) and next(iter(cache.packs.values())) is first  # packed once, reused
        for rows in (5, 7):  # two more row counts: the oldest pack goes
            assert (lin(x[:1, :rows]) - F.linear(x[:1, :rows], lin.weight, lin.bias)).abs().max() <= 1e-5
        assert len(cache.packs) == cache.keep == 2 and all(p is not first for p in cache.packs.values())
        with torch.autocast("cpu", torch.bfloat16):
            auto, ref = lin(x), F.linear(x, lin.weight, lin.bias)
        assert auto.dtype == ref.dtype == torch.bfloat16 and (auto.float() - ref.float()).abs().max() <= 0.05
    with torch.no_grad():
        lin.weight.mul_(-2.0)  # an in-place change (as load_state_dict makes): packed again from the new values
        assert (lin(x) - F.linear(x, lin.weight, lin.bias)).abs().max() <= 1e-5
        twin = copy.deepcopy(lin)
        assert twin._packs.packs == {} and (twin(x) - lin(x)).abs().max() <= 1e-5
        with FlopCounterMode(display=False) as counter:
            lin(x)  # a dispatch mode sees the plain op
    assert counter.get_total_flops() == 2 * 2 * 197 * 192 * 576
    if onednn.MKL_PACKED:
        assert "mkl" in {key[0] for key in cache.packs}  # fp32: MKL's packed sgemm, unless oneDNN's is on
    out = lin(x.requires_grad_())  # under grad: F.linear, with its backward
    assert out.grad_fn is not None and torch.equal(out, F.linear(x, lin.weight, lin.bias))
    half = copy.deepcopy(lin).to(torch.bfloat16)  # bf16 weights: oneDNN's packed bf16 matmul
    half.widened = True  # where oneDNN has none, bf16 widened to fp32 on packed weights (its own switch)
    with torch.inference_mode():
        xb = x.detach().bfloat16()
        assert (half(xb).float() - F.linear(xb, half.weight, half.bias).float()).abs().max() <= 0.05
        assert {key[0] for key in half._packs.packs} == {half.packed_plan(torch.bfloat16)[1]}


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_mlp_runs_fc1_and_gelu_as_one_matmul_where_fc1_is_packed_in_onednn(act, monkeypatch):
    import vitkit.layers.mlp as mlp_module

    calls = []
    real = mlp_module.linear_gelu
    monkeypatch.setattr(mlp_module, "linear_gelu", lambda *a: calls.append(1) or real(*a))  # counts, then runs it
    torch.manual_seed(0)
    mlp = mlp_module.Mlp(192, 768, act=act).eval()
    x = torch.randn(2, 50, 192)
    with torch.inference_mode():
        plain = mlp(x)
        assert calls == []  # layers default to timm's path
        mlp.fc1.packed = mlp.fc2.packed = True  # what vitkit.hardware sets where packed_linear is on
        fp32_fused = mlp.fc1.packed_plan(torch.float32)[1] == "onednn"  # MKL's packed sgemm has no GELU epilogue
        before = x.clone()
        assert (mlp(x) - plain).abs().max() <= 1e-5 and len(calls) == fp32_fused
        assert torch.equal(x, before)  # without the epilogue the GELU runs in place on fc1's output, not on x
        mlp.fc1.onednn = True  # fp32 linears in oneDNN (an `onednn_linear` machine): the GELU rides in fc1's matmul
        assert (mlp(x) - plain).abs().max() <= 1e-5 and len(calls) == 1 + fp32_fused
        calls.clear()
        with torch.autocast("cpu", torch.bfloat16):  # bf16 runs oneDNN: fused (F.linear where bf16 is emulated)
            auto = mlp(x)
        fused_bf16 = [1] if mlp_module._ONEDNN_BF16 else []
        assert auto.dtype == torch.bfloat16 and _cos(auto, plain) > 0.999 and calls == fused_bf16
        seen = []
        hook = mlp.act.register_forward_hook(lambda m, i, o: seen.append(o.shape))
        try:  # a hook on the activation must see its call: the module path runs
            assert (mlp(x) - plain).abs().max() <= 1e-5 and seen == [(2, 50, 768)] and calls == fused_bf16
        finally:
            hook.remove()
    out = mlp(x)  # under grad: the module path, with its backward
    out.sum().backward()
    assert calls == fused_bf16 and mlp.fc1.weight.grad is not None


def test_mlp_inference_runs_its_gelu_in_place_with_the_module_paths_numbers():
    """With no fast path on (timm's kernels), inference runs the MLP's GELU in place on fc1's fresh output: the
    module path's numbers bit for bit, the input untouched, one hidden-sized buffer instead of two. Under grad, with
    a hook on the activation, or for another activation, the module path runs."""
    from torch.profiler import ProfilerActivity, profile

    from vitkit.layers.mlp import Mlp

    def gelu_ops(module, x):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = module(x)
        return out, {e.key for e in prof.key_averages()} & {"aten::gelu", "aten::gelu_"}

    torch.manual_seed(0)
    mlp = Mlp(24, 96).eval()
    x = torch.randn(2, 9, 24)
    before = x.clone()
    with torch.no_grad():
        ref = mlp.fc2(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)))
        out, ops = gelu_ops(mlp, x)
        assert torch.equal(out, ref) and ops == {"aten::gelu_"} and torch.equal(x, before)
        with torch.autocast("cpu", torch.bfloat16):
            auto, ops = gelu_ops(mlp, x)
        assert auto.dtype == torch.bfloat16 and ops == {"aten::gelu_"} and _cos(auto, ref) > 0.999
        seen = []
        hook = mlp.act.register_forward_hook(lambda m, i, o: seen.append(o.shape))
        try:
            out, ops = gelu_ops(mlp, x)
            assert torch.equal(out, ref) and ops == {"aten::gelu"} and seen == [(2, 9, 96)]
        finally:
            hook.remove()
        tanh = Mlp(24, 96, act="gelu_tanh").eval()
        assert gelu_ops(tanh, x)[1] == {"aten::gelu_"}
        assert gelu_ops(Mlp(24, 96, act="quick_gelu").eval(), x)[1] == set()  # not a GELU: the module path
    out, ops = gelu_ops(mlp, x)  # under grad: autograd keeps GELU's input
    assert ops == {"aten::gelu"} and out.grad_fn is not None and torch.equal(out.detach(), ref)


def test_packed_linear_shared_by_threads_with_changing_batch_shapes():
    """A server's worker threads share one model: packs of three row counts made and dropped concurrently (two
    kept) must neither fail nor mix shapes."""
    from concurrent.futures import ThreadPoolExecutor

    from vitkit.layers.mlp import Linear

    torch.manual_seed(0)
    lin = Linear(64, 96)
    lin.packed = True
    xs = [torch.randn(rows, 64) for rows in (3, 5, 7)]
    want = [F.linear(x, lin.weight, lin.bias) for x in xs]

    def call(i: int) -> bool:
        with torch.inference_mode():
            return bool((lin(xs[i % 3]) - want[i % 3]).abs().max() <= 1e-5)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(call, range(120)))
    assert len(lin._packs.packs) <= lin._packs.keep


def _prints_ok_under_the_avx2_cap(code: str) -> None:
    """Run `code` in a fresh process with torch's and oneDNN's kernels capped at AVX2 (bf16 emulated, no oneDNN bf16
    matmul): it must exit cleanly and print only "ok"."""
    env = os.environ | {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_bf16_is_widened_to_fp32_on_packed_weights_under_its_own_switch_where_onednn_has_no_bf16_kernel():
    """Under the AVX2 cap oneDNN has no bf16 matmul (its reorder raised in `vitkit bench`'s bf16 rows): a layer
    whose `widened` switch is on (`widened_bf16`) then widens its bf16-rounded operands to fp32 (exact), multiplies
    on packed fp32 weights and rounds the output to bf16, what a bf16 matmul with fp32 accumulation computes; the
    MLP's GELU is not fused there. The two switches are apart: `packed` alone (`packed_linear`) leaves bf16 on
    F.linear, and `widened` alone leaves fp32 on F.linear (a capped Zen 4 measured the fp32 packing at 0.94x)."""
    code = """
import torch, torch.nn.functional as F
from vitkit import onednn
from vitkit.layers.mlp import Linear, Mlp
assert not onednn.BF16
torch.manual_seed(0)
mlp = Mlp(32, 64).eval()
torch.manual_seed(0)
wide = Mlp(32, 64).eval()  # the same weights, packs of its own
x = torch.randn(2, 5, 32)
def close(a, b):
    return a.dtype == b.dtype == torch.bfloat16 and (a.float() - b.float()).abs().max() <= 0.02 * b.float().abs().max()
def packed_dtypes(m):
    return {key[2] for key in m.__dict__.get("_packs").packs} if "_packs" in m.__dict__ else set()
with torch.inference_mode():
    ref = mlp.fc2(F.gelu(F.linear(x, mlp.fc1.weight, mlp.fc1.bias)))
    mlp.fc1.packed = mlp.fc2.packed = True  # fp32 packing only
    with torch.autocast("cpu", torch.bfloat16):
        assert mlp(x).dtype == torch.bfloat16
    assert packed_dtypes(mlp.fc1) == set()  # bf16 autocast stayed on F.linear
    assert (mlp(x) - ref).abs().max() <= 1e-5 and packed_dtypes(mlp.fc1) == {torch.float32}
    mlp = wide
    mlp.fc1.widened = mlp.fc2.widened = True  # the widened bf16 path only
    assert mlp.fc1.packed_plan(torch.bfloat16)[0] == torch.float32
    assert (mlp(x) - ref).abs().max() <= 1e-5 and packed_dtypes(mlp.fc1) == set()  # fp32 stayed on F.linear
    with torch.autocast("cpu", torch.bfloat16):
        got, want = mlp.fc1(x), F.linear(x, mlp.fc1.weight, mlp.fc1.bias)
        assert close(got, want) and mlp(x).dtype == torch.bfloat16
    assert packed_dtypes(mlp.fc1) == {torch.bfloat16}
    half = mlp.to(torch.bfloat16)
    xb = x.bfloat16()
    assert close(half.fc1(xb), F.linear(xb, half.fc1.weight, half.fc1.bias))
    assert close(half(xb), half.fc2(F.gelu(F.linear(xb, half.fc1.weight, half.fc1.bias))))
    assert {key[3] for key in half.fc1._packs.packs} == {torch.float32}
print("ok")
"""
    _prints_ok_under_the_avx2_cap(code)


def test_widened_bf16_training_matches_autocast_where_onednn_has_no_bf16_matmul():
    """Under the AVX2 cap (bf16 emulated) the `widened_bf16_training` linear computes what bf16 autocast's F.linear
    does, forward and both gradients, from bf16-rounded operands widened to fp32; where oneDNN has a bf16 matmul
    (this machine, uncapped, where it has one) the switch changes nothing."""
    code = """
import torch, torch.nn.functional as F
from vitkit import onednn
from vitkit.layers.mlp import Linear
assert not onednn.BF16
torch.manual_seed(0)
lin = Linear(48, 80)
x = torch.randn(3, 7, 48, requires_grad=True)
def run(widened):
    lin.widened_training = widened
    x.grad = lin.weight.grad = lin.bias.grad = None
    with torch.autocast("cpu", torch.bfloat16):
        out = lin(x)
    (out.float() * torch.linspace(-1, 1, 80)).sum().backward()
    return out, x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone(), type(out.grad_fn).__name__
ref, wide = run(False), run(True)
assert wide[4] == "WidenedLinearBackward" and ref[4] != wide[4]
assert wide[0].dtype == ref[0].dtype == torch.bfloat16
for got, want in zip(wide[:4], ref[:4]):
    assert got.dtype == want.dtype and (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()
print("ok")
"""
    _prints_ok_under_the_avx2_cap(code)
    import vitkit.onednn as onednn
    from vitkit.layers.mlp import Linear

    if onednn.BF16:  # oneDNN's own bf16 matmul here: the widened form never runs
        lin = Linear(8, 8)
        lin.widened_training = True
        with torch.autocast("cpu", torch.bfloat16):
            out = lin(torch.randn(2, 8, requires_grad=True))
        assert type(out.grad_fn).__name__ != "WidenedLinearBackward"


def test_packed_weights_follow_a_fused_optimizer_step():
    """AdamW(fused=True) changes weights without bumping their version counters: the packs must not outlive the
    step (the bug that made a resumed detection run score differently from an uninterrupted one)."""
    from vitkit.layers.mlp import Linear

    torch.manual_seed(0)
    lin = Linear(32, 48)
    lin.packed = True
    x = torch.randn(4, 32)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, fused=True)
    for _ in range(2):
        with torch.no_grad():
            assert (lin(x) - F.linear(x, lin.weight, lin.bias)).abs().max() <= 1e-5
        version = lin.weight._version
        lin(x).square().sum().backward()  # under grad: F.linear
        opt.step()
        opt.zero_grad()
        assert lin.weight._version == version  # the step left the counter as it was: what the packs cannot rely on
