"""OpenVINO as a runtime: IR export with vitkit's metadata, parity with PyTorch on each family kind, the
checkpoint converted on first use and cached by content hash, `vitkit.runner`, the CLI's `--openvino` and
`--backend openvino`, and bad input as one line naming what to do. Real models (small sizes), real OpenVINO."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch
from PIL import Image
from torch import nn

import vitkit
from vitkit.cli.main import main
from vitkit.errors import ConfigError, VitkitError
from vitkit.hardware import detect

pytest.importorskip("openvino")

from vitkit.export.openvino import IR_BIN, IR_XML, META_FILE, OpenVinoRunner, export_openvino  # noqa: E402
from vitkit.export.runner import CLOSE_CALL_REPEATS, METHOD, fastest  # noqa: E402

# (name, create_model kwargs): one of each kind the issue names; sizes small enough for a few seconds each
PARITY_MODELS = {
    "vit": ("vit_pico_patch2_8", {}),
    "swin": ("swin_tiny_patch4_window7_224", dict(img_size=32, window_size=4, embed_dim=24, depths=(1, 1, 1, 1),
                                                  num_heads=(1, 1, 1, 1), num_classes=5)),
    "hybrid": ("vit_tiny_r_s16_p8_224", dict(depth=1, img_size=32, num_classes=7)),
    "clip_image_tower": ("clip_vit_tiny_test", {}),
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))


def batch_for(model, b: int = 3, seed: int = 1) -> torch.Tensor:
    C, (H, W) = model.cfg.in_chans, model.cfg.img_size
    return torch.randn(b, C, H, W, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def pico_ir(tmp_path_factory):
    """One exported IR folder of a small ViT; tests that damage it work on a copy."""
    folder = tmp_path_factory.mktemp("pico") / "ir"
    torch.manual_seed(0)
    export_openvino(vitkit.create_model("vit_pico_patch2_8"), folder)
    return folder


def copy_of(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "ir")


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("kind", list(PARITY_MODELS))
def test_f32_logits_equal_torch(kind):
    name, kw = PARITY_MODELS[kind]
    torch.manual_seed(0)
    model = vitkit.create_model(name, **kw).eval()
    run = vitkit.runner(model, backend="openvino", precision="fp32")
    assert (run.backend, run.precision) == ("openvino", "fp32")
    x = batch_for(model)
    with torch.no_grad():
        expect = model(x)
    got = run(x)
    assert got.shape == expect.shape
    assert float((got - expect).abs().max()) <= 1e-4


def test_pooled_features_and_numpy_in_numpy_out():
    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8").eval()
    x = batch_for(model)
    with torch.no_grad():
        expect = model.forward_head(model.forward_features(x), pre_logits=True)
    for backend in ("torch", "openvino"):
        run = vitkit.runner(model, backend=backend, precision="fp32", features=True)
        got = run(x.numpy())
        assert type(got).__name__ == "ndarray" and got.shape == tuple(expect.shape)
        assert float(abs(got - expect.numpy()).max()) <= 1e-4, backend


@pytest.mark.skipif(not detect().native_bf16, reason=f"bf16 runs only with native bf16; this CPU: {detect().kind}")
def test_bf16_top1_agrees_on_fashion_mnist_test_set():
    from vitkit.data.datasets import eval_loader, load_eval_split
    from vitkit.export import compare_top1

    try:
        _, _, test = load_eval_split("fashion-mnist", channels=1, class_names=None, split="test")
    except VitkitError as e:
        pytest.skip(f"Fashion-MNIST is not here: {e}")
    model = vitkit.load_model("bundled:fashion-mnist").eval()
    run = vitkit.runner(model, backend="openvino", precision="bf16")
    torch_bf16 = vitkit.runner(model, backend="torch", precision="bf16")  # bf16 weights, on a copy
    res = compare_top1({"torch": model, "openvino_bf16": run, "torch_bf16": torch_bf16},
                       eval_loader(test, model.preprocess, batch_size=256))
    assert res["agreement_with_torch"]["openvino_bf16"] >= 99.5
    assert res["agreement_with_torch"]["torch_bf16"] >= 99.5
    assert next(model.parameters()).dtype == torch.float32


@pytest.mark.skipif(detect().native_bf16, reason="this CPU has native bf16: bf16 runs")
def test_bf16_without_native_bf16_is_one_line():
    model = vitkit.create_model("vit_pico_patch2_8")
    with pytest.raises(ConfigError, match="native bf16") as e:
        vitkit.runner(model, backend="openvino", precision="bf16")
    assert "\n" not in str(e.value) and "--precision fp32" in str(e.value)


def test_checkpoint_converted_once_and_cached_by_content(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8")
    ckpt = tmp_path / "m.safetensors"
    vitkit.save_model(model, ckpt, class_names=[f"c{i}" for i in range(10)])
    cache = tmp_path / "cache" / "openvino"
    first = vitkit.runner(ckpt, backend="openvino", precision="fp32")
    folders = sorted(cache.iterdir())
    assert len(folders) == 1 and {p.name for p in folders[0].iterdir()} == {IR_XML, IR_BIN, META_FILE}
    stamp = (folders[0] / IR_BIN).stat().st_mtime_ns
    again = vitkit.runner(ckpt, backend="openvino", precision="fp32")
    assert (folders[0] / IR_BIN).stat().st_mtime_ns == stamp  # read from the cache, not converted again
    x = batch_for(model)
    assert torch.equal(first(x), again(x)) and again.class_names == [f"c{i}" for i in range(10)]
    with torch.no_grad():
        model.head.bias.add_(1.0)  # other weights: another content hash, another conversion
    vitkit.save_model(model, ckpt, class_names=[f"c{i}" for i in range(10)])
    changed = vitkit.runner(ckpt, backend="openvino", precision="fp32")
    assert len(list(cache.iterdir())) == 2
    with torch.no_grad():
        assert float((changed(x) - model.eval()(x)).abs().max()) <= 1e-4


def test_auto_backend_measured_once_and_cached(tmp_path, monkeypatch):
    model = vitkit.create_model("vit_pico_patch2_8")
    assert vitkit.runner(model).backend == "torch"  # VITKIT_MEASURE=0 (the tests' setting): no measuring
    monkeypatch.setenv("VITKIT_MEASURE", "1")
    run = vitkit.runner(model, precision="fp32", batch_size=2)
    cache = tmp_path / "cache" / "runtimes.json"
    entries = json.loads(cache.read_text())
    ((key, entry),) = entries.items()
    assert key.startswith(f"method {METHOD} | ")  # what "auto" timed: a change of method measures again
    assert run.backend == entry["backend"] in ("torch", "openvino", "onnx") and set(entry["seconds_per_batch"]) == {
        "torch", "openvino", "onnx"}
    entry["backend"] = "openvino" if run.backend == "torch" else "torch"  # the cache decides a later call
    cache.write_text(json.dumps({k: entry for k in entries}))
    assert vitkit.runner(model, precision="fp32", batch_size=2).backend == entry["backend"]
    cache.write_text("{not json")  # corrupt: measured again, never a crash
    assert vitkit.runner(model, precision="fp32", batch_size=2).backend in ("torch", "openvino", "onnx")
    assert json.loads(cache.read_text())
    # ONNX Runtime has no bf16 and gives logits only: features measure torch against OpenVINO alone
    features = vitkit.runner(model, precision="fp32", batch_size=2, features=True)
    x = torch.randn(2, model.cfg.in_chans, 8, 8)
    assert features.backend in ("torch", "openvino") and features(x).shape == (2, model.num_features)
    (feature_entry,) = [v for k, v in json.loads(cache.read_text()).items() if "features" in k]
    assert set(feature_entry["seconds_per_batch"]) == {"torch", "openvino"}


def test_a_batch_split_across_streams_gives_the_one_stream_outputs_in_order(pico_ir):
    one = OpenVinoRunner(pico_ir, threads=2)
    two = vitkit.runner(pico_ir, backend="openvino", precision="fp32", threads=2, streams=2)
    assert two.streams == 2 and "streams=2" in repr(two)
    for b in (1, 2, 5):  # 5: slices of 3 and 2, put back in order
        x = batch_for(two, b, seed=b)
        assert torch.allclose(two(x), one(x), atol=1e-5), b
    with pytest.raises(ConfigError, match="between 1 and the thread count"):
        OpenVinoRunner(pico_ir, threads=2, streams=3)
    with pytest.raises(ConfigError, match="OpenVINO's streams"):
        vitkit.runner(vitkit.create_model("vit_pico_patch2_8"), backend="torch", streams=2)


def test_a_runner_built_for_a_batch_size_compiles_that_shape_fixed_and_others_on_the_dynamic_graph(pico_ir):
    dynamic = OpenVinoRunner(pico_ir, threads=2)
    fixed = OpenVinoRunner(pico_ir, threads=2, streams=2, batch_size=5)  # slices of 3 and 2
    assert fixed.static_sizes == [2, 3] and sorted(fixed._requests) == [2, 3]  # nothing batch-dynamic compiled yet
    for size in (2, 3):
        assert str(fixed._requests[size][0].get_compiled_model().inputs[0].partial_shape) == f"[{size},1,8,8]"
    assert not dynamic._requests[None][0].get_compiled_model().inputs[0].partial_shape.is_static
    for b in (5, 4, 7, 1):  # 4: two slices of 2 on the fixed graph; 7: 4 on the dynamic one, 3 on the fixed one
        x = batch_for(fixed, b, seed=b)
        assert torch.equal(fixed(x), dynamic(x)), b
    assert None in fixed._requests  # compiled when a batch first needed it
    run = vitkit.runner(pico_ir, backend="openvino", precision="fp32", threads=2, batch_size=3)
    assert run._call.static_sizes == [3] and torch.equal(run(batch_for(run, 3)), dynamic(batch_for(run, 3)))
    with pytest.raises(ConfigError, match="batch_size must be a positive"):
        OpenVinoRunner(pico_ir, batch_size=0)


def test_auto_times_openvino_split_across_streams_where_the_batch_and_threads_allow(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_MEASURE", "1")
    model = vitkit.create_model("vit_pico_patch2_8")
    run = vitkit.runner(model, precision="fp32", batch_size=4, threads=2)
    (entry,) = json.loads((tmp_path / "cache" / "runtimes.json").read_text()).values()
    assert set(entry["seconds_per_batch"]) == {"torch", "openvino", "openvino x2", "onnx"}
    assert (run.backend, run.streams) == {"torch": ("torch", 1), "onnx": ("onnx", 1), "openvino": ("openvino", 1),
                                          "openvino x2": ("openvino", 2)}[entry["backend"]]
    if run.backend == "openvino":  # built for the batch it was measured at, as it was timed
        assert run._call.static_sizes == ([4] if run.streams == 1 else [2])
    x = batch_for(model, 4)
    with torch.no_grad():
        assert float((run(x) - model.eval()(x)).abs().max()) <= 1e-4


def test_export_metadata_and_folder_is_written_whole(tmp_path):
    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8")
    model.provenance = {"dataset": "digits", "seed": 3}
    out = export_openvino(model, tmp_path / "ir")
    assert out["max_abs_diff"] <= 1e-4 and out["checked_shapes"] == [[2, 8, 8], [3, 8, 8]]
    meta = json.loads((tmp_path / "ir" / META_FILE).read_text())
    assert meta["preprocess"] == model.preprocess.to_dict() and meta["provenance"] == {"dataset": "digits", "seed": 3}
    assert meta["family"] == model.family and meta["openvino"] == out["openvino"]
    assert [p.name for p in tmp_path.iterdir()] == ["ir"]  # no staging folder left beside it


def test_a_batch_of_the_wrong_shape_is_one_line(pico_ir):
    run = vitkit.runner(pico_ir, backend="openvino", precision="fp32")
    assert run(torch.randn(2, 1, 8, 8)).shape == (2, 10)
    for bad in (torch.randn(2, 3, 8, 8), torch.randn(2, 1, 16, 16), torch.randn(1, 8, 8)):
        with pytest.raises(ConfigError) as e:
            run(bad)
        assert str(e.value).count("\n") == 0 and "[B, 1, 8, 8]" in str(e.value)


def test_ir_folder_missing_a_file_is_one_line(pico_ir, tmp_path):
    copy_of(pico_ir, tmp_path)
    (tmp_path / "ir" / IR_BIN).unlink()
    with pytest.raises(VitkitError) as e:
        vitkit.runner(tmp_path / "ir", backend="openvino")
    assert str(e.value).count("\n") == 0 and "model.bin" in str(e.value) and "vitkit export CKPT --openvino" in str(
        e.value)


def test_ir_from_another_openvino_version_is_one_line(pico_ir, tmp_path):
    copy_of(pico_ir, tmp_path)
    xml = tmp_path / "ir" / IR_XML
    text = xml.read_text()
    start = text.index('version="', text.index("<net ")) + len('version="')
    xml.write_text(text[:start] + "99" + text[text.index('"', start):])  # an IR version this OpenVINO cannot read
    meta = json.loads((tmp_path / "ir" / META_FILE).read_text())
    (tmp_path / "ir" / META_FILE).write_text(json.dumps(meta | {"openvino": "2099.1.0"}))
    with pytest.raises(VitkitError) as e:
        OpenVinoRunner(tmp_path / "ir")
    msg = str(e.value)
    assert "\n" not in msg and "written by OpenVINO 2099.1.0" in msg and "vitkit export CKPT --openvino" in msg


class _Eigenvalues(nn.Module):
    """A head made of an op OpenVINO has no conversion for."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        square = x[:, :4, None] * x[:, None, :4]  # [B, 4, 4]
        return torch.linalg.eigvals(square + torch.eye(4)).real  # [B, 4]


def test_model_openvino_cannot_convert_is_one_line(tmp_path):
    model = vitkit.create_model("vit_pico_patch2_8")
    model.head = _Eigenvalues()
    with pytest.raises(VitkitError) as e:
        export_openvino(model, tmp_path / "ir")
    msg = str(e.value)
    assert "\n" not in msg and "aten::linalg_eigvals" in msg and "--backend torch or onnx" in msg
    assert not (tmp_path / "ir").exists()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    d = tmp_path_factory.mktemp("ov_cli")
    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8", num_classes=3)
    vitkit.save_model(model, d / "m.safetensors", class_names=["a", "b", "c"])
    for cls, colour in (("a", (250, 10, 10)), ("b", (10, 250, 10)), ("c", (10, 10, 250))):
        (d / "data" / cls).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (8, 8), tuple(max(0, c - 60 * i) for c in colour)).save(d / "data" / cls / f"{i}.png")
    return d


def test_cli_export_then_predict_matches_torch(saved, tmp_path, capsys):
    rc, out, err = run_cli(capsys, "export", saved / "m.safetensors", "--openvino", tmp_path / "ir", "--json")
    assert rc == 0, err
    assert json.loads(out)["openvino"]["max_abs_diff"] <= 1e-4
    images = sorted(str(p) for p in (saved / "data").rglob("*.png"))
    rc, torch_out, _ = run_cli(capsys, "predict", saved / "m.safetensors", *images, "--json", "--precision", "fp32")
    rc2, ov_out, err = run_cli(capsys, "predict", tmp_path / "ir", *images, "--backend", "openvino", "--json",
                                 "--precision", "fp32")  # auto is bf16 where native: this compares fp32
    assert rc == rc2 == 0, err
    for a, b in zip(json.loads(torch_out)["predictions"], json.loads(ov_out)["predictions"]):
        assert [t["index"] for t in a["top"]] == [t["index"] for t in b["top"]]
        assert max(abs(s["prob"] - t["prob"]) for s, t in zip(a["top"], b["top"])) <= 1e-5


def test_cli_eval_matches_torch(saved, tmp_path, capsys):
    export_openvino(vitkit.load_model(saved / "m.safetensors"), tmp_path / "ir")
    evals = {}
    for source, backend in ((saved / "m.safetensors", "torch"), (tmp_path / "ir", "openvino"),
                            (saved / "m.safetensors", "openvino")):  # a checkpoint: converted on first use
        rc, out, err = run_cli(capsys, "eval", source, "--data", saved / "data", "--backend", backend, "--json",
                                   "--precision", "fp32")
        assert rc == 0, err
        evals[(str(source), backend)] = json.loads(out)
    first, *others = evals.values()
    for other in others:
        assert other["confusion"] == first["confusion"] and abs(other["loss"] - first["loss"]) <= 1e-5


def test_cli_bad_ir_folder_is_one_stderr_line(saved, tmp_path, capsys):
    (tmp_path / "ir").mkdir()
    (tmp_path / "ir" / IR_XML).write_text("<net/>")
    rc, out, err = run_cli(capsys, "predict", tmp_path / "ir", saved / "data" / "a" / "0.png", "--backend", "openvino")
    assert rc != 0 and len(err.strip().splitlines()) == 1 and "model.bin" in err and "Traceback" not in err


def test_without_openvino_installed_is_one_line_naming_the_extra(saved, tmp_path):
    code = ("import sys\nsys.modules['openvino'] = None\nfrom vitkit.cli.main import main\n"
            f"sys.exit(main(['export', {str(saved / 'm.safetensors')!r}, '--openvino', {str(tmp_path / 'ir')!r}]))\n")
    env = {k: v for k, v in os.environ.items() if k != "VITKIT_DEBUG"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1 and "pip install 'vitkit[openvino]'" in err, err


def test_cli_export_needs_a_target_and_int8_needs_onnx(saved, tmp_path, capsys):
    rc, _, err = run_cli(capsys, "export", saved / "m.safetensors")
    assert rc == 2 and "--onnx OUT.onnx and/or --openvino DIR" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli(capsys, "export", saved / "m.safetensors", "--openvino", tmp_path / "ir", "--int8")
    assert rc == 2 and "apply to --onnx" in err and not (tmp_path / "ir").exists()


def test_runners_released_in_any_order_leave_signals_working(pico_ir, fresh_python):
    """Two runners released first-made-first (as garbage collection may), then a signal with a Python handler
    (what SIGCHLD from a finished subprocess is to a DataLoader or a server): the process handles it. With one
    Core per runner, the CPU plugin of the first-made Core unmapped the signal stack the thread was left on,
    and this process died of a segmentation fault (the crash of the whole test suite that found it)."""
    code = (f"import gc, os, signal\nfrom vitkit.export.openvino import OpenVinoRunner\n"
            f"a, b = OpenVinoRunner({str(pico_ir)!r}), OpenVinoRunner({str(pico_ir)!r})\n"
            "del a; gc.collect()\ndel b; gc.collect()\n"
            "got = []\nsignal.signal(signal.SIGUSR1, lambda *_: got.append(1))\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\nprint('handled', len(got))\n")
    run = fresh_python.run(code, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "handled 1", (run.returncode, run.stderr[-500:])


def test_auto_times_a_close_call_again_among_the_leaders_only():
    """Leaders within the margin get CLOSE_CALL_REPEATS more rounds among themselves; a clear loser does not."""
    counts = {"fast": 0, "slow": 0}

    def call(name, seconds):  # longer than paired_times' min_sample: one call a sample, so the counts are exact
        def run():
            counts[name] += 1
            time.sleep(seconds)
        return run

    calls = {"fast": call("fast", 0.025), "slow": call("slow", 0.075)}
    best, medians, close = fastest(calls)  # 3x apart: no close call, 2 warm-up + 5 rounds each
    assert (best, close) == ("fast", []) and medians["fast"] < medians["slow"] and counts == {"fast": 7, "slow": 7}
    best, medians, close = fastest(calls, close_call=10.0)  # both within the margin: both timed again, longer
    assert sorted(close) == ["fast", "slow"] and best == "fast"
    assert counts == dict.fromkeys(counts, 7 + 7 + 1 + CLOSE_CALL_REPEATS)
