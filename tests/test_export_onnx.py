"""ONNX export, ONNX Runtime parity, int8 quantisation and the `vitkit export` CLI, on a small model
trained for a few seconds on sklearn's digits (so that argmax agreement means something)."""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.cli.main import main
from vitkit.export import ExportError, OnnxRunner, compare_top1, export_onnx, quantize_int8


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0  # [N, 1, 8, 8] in [0, 1]
    return (x - 0.5) / 0.5, torch.tensor(d.target)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A pico ViT trained ~300 steps on 1500 digits; the remaining 297 are held out."""
    torch.manual_seed(0)
    x, y = _digits()
    model = vitkit.create_model("vit_pico_patch2_8")
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for step in range(300):
        idx = torch.randint(0, 1500, (64,))
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    path = tmp_path_factory.mktemp("export") / "pico.onnx"
    report = export_onnx(model, path)  # fixed size, dynamic batch
    return model, path, report, (x[1500:], y[1500:])


def test_fixed_size_export_matches_pytorch_at_any_batch(trained):
    model, path, report, (x, _) = trained
    assert report["max_abs_diff"] <= 1e-4 and report["dynamic_batch"] and not report["dynamic_size"]
    runner = OnnxRunner(path, threads=1)
    assert runner.session.get_inputs()[0].shape[0] == "batch"
    for b in (1, 7, 64):
        with torch.no_grad():
            expect = model(x[:b])
        got = runner(x[:b])  # tensor in, tensor out
        assert isinstance(got, torch.Tensor) and got.shape == (b, 10)
        assert (got - expect).abs().max() <= 1e-4
    assert isinstance(runner(x[:2].numpy()), np.ndarray)
    # metadata travels: predict/eval read these off the runner as off a model
    assert runner.cfg == model.cfg and runner.num_classes == 10
    assert runner.preprocess.input_size == (1, 8, 8) and not runner.training


def test_dynamic_size_export_runs_any_multiple_of_the_patch(trained, tmp_path):
    model = trained[0]
    report = export_onnx(model, tmp_path / "any.onnx", dynamic_size=True)
    assert report["max_abs_diff"] <= 1e-4 and [3, 10, 12] in report["checked_shapes"]
    runner = OnnxRunner(tmp_path / "any.onnx", threads=1)
    x = torch.randn(2, 1, 14, 6)
    # the graph resamples positions bilinearly without antialias: the PyTorch model configured that way
    bilinear = vitkit.VisionTransformer(model.cfg.replace(pos_interpolation="bilinear", pos_antialias=False)).eval()
    bilinear.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert (runner(x) - bilinear(x)).abs().max() <= 1e-4
        assert (runner(trained[3][0][:4]) - model(trained[3][0][:4])).abs().max() <= 1e-4  # native size: exact


@pytest.mark.parametrize("pos_embed", ["sincos", "sincos_hw"])
def test_dynamic_size_export_of_a_sincos_model_regenerates_its_table(pos_embed, tmp_path):
    """A fixed sin-cos table is regenerated in the graph for each input's grid: the PyTorch rule, exactly."""
    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8", pos_embed=pos_embed, global_pool="avg", class_token=False)
    report = export_onnx(model.eval(), tmp_path / "sincos.onnx", dynamic_size=True)
    assert report["max_abs_diff"] <= 1e-4
    runner = OnnxRunner(tmp_path / "sincos.onnx", threads=1)
    x = torch.randn(2, 1, 14, 6)
    with torch.no_grad():
        assert (runner(x) - model(x)).abs().max() <= 1e-4


def test_a_resnet_exports_too(tmp_path):
    model = vitkit.create_model("resnet18", num_classes=3, in_chans=1, img_size=16).eval()
    report = export_onnx(model, tmp_path / "rn.onnx", dynamic_size=True)
    runner = OnnxRunner(tmp_path / "rn.onnx", threads=1)
    assert report["max_abs_diff"] <= 1e-4 and runner.cfg == model.cfg
    x = torch.randn(2, 1, 20, 12)
    with torch.no_grad():
        assert (runner(x) - model(x)).abs().max() <= 1e-4


def test_int8_model_runs_and_agrees_with_fp32(trained, tmp_path):
    model, path, _, (x, y) = trained
    q = quantize_int8(path, tmp_path / "pico.int8.onnx")
    int8 = OnnxRunner(q, threads=1)
    assert int8.class_names == OnnxRunner(path).class_names and int8.cfg == model.cfg
    batches = [(x[i:i + 100], y[i:i + 100]) for i in range(0, len(y), 100)]
    res = compare_top1({"pytorch": model, "int8": int8}, batches)
    assert res["count"] == len(y)
    assert res["top1"]["pytorch"] > 70  # the fixture model learned something
    assert res["agreement_with_pytorch"]["int8"] >= 90
    assert abs(res["top1"]["int8"] - res["top1"]["pytorch"]) <= 5


def test_parity_failure_is_an_export_error(trained, tmp_path):
    with pytest.raises(ExportError, match="differ from PyTorch"):
        export_onnx(trained[0], tmp_path / "strict.onnx", dynamic_batch=False, tol=-1.0)  # an impossible tolerance
    with pytest.raises(ExportError, match="no such ONNX file"):
        OnnxRunner(tmp_path / "missing.onnx")


def test_export_cli_writes_file_and_reports_parity(trained, tmp_path, capsys):
    ckpt = vitkit.save_model(trained[0], tmp_path / "pico.safetensors", class_names=[str(i) for i in range(10)])
    out = tmp_path / "cli.onnx"
    assert main(["export", str(ckpt), "--onnx", str(out), "--static-batch", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert out.is_file() and report["path"] == str(out) and report["max_abs_diff"] <= 1e-4
    assert OnnxRunner(out).class_names == [str(i) for i in range(10)]
    assert main(["export", str(tmp_path / "nope.safetensors"), "--onnx", str(out)]) == 2


def test_quantize_keeps_the_callers_logging_disable_level(trained, tmp_path):
    logging.disable(logging.INFO)  # a caller silencing INFO and below
    try:
        quantize_int8(trained[1], tmp_path / "quiet.int8.onnx")
        assert logging.root.manager.disable == logging.INFO
    finally:
        logging.disable(logging.NOTSET)
    quantize_int8(trained[1], tmp_path / "loud.int8.onnx")
    assert logging.root.manager.disable == logging.NOTSET  # and nothing stays disabled when nothing was


def test_export_cli_int8_reports_speedup_and_top1_change(trained, tmp_path, capsys):
    ckpt = vitkit.save_model(trained[0], tmp_path / "pico.safetensors")
    out = tmp_path / "q.onnx"
    assert main(["export", str(ckpt), "--onnx", str(out), "--int8", "--eval-data", "digits", "--eval-limit", "150",
                 "--json"]) == 0
    q = json.loads(capsys.readouterr().out)["int8"]
    assert q["path"] == str(tmp_path / "q.int8.onnx") and (tmp_path / "q.int8.onnx").is_file()
    assert q["speedup_vs_fp32_onnx"] > 0 and q["accuracy"]["count"] == 150
    top1 = q["accuracy"]["top1"]
    assert top1["pytorch"] > 70 and q["top1_change_points"] == pytest.approx(top1["int8"] - top1["pytorch"])


def test_int8_report_scores_the_images_eval_scores(trained, tmp_path):
    """The int8 report of an exported model: a speed-up over the fp32 graph and the top-1 change, on the split
    `vitkit eval` scores (digits' held-out test split, through the same loader, so PyTorch's top-1 is eval's)."""
    from vitkit.export.int8 import int8_report
    from vitkit.inference import evaluate_on

    model, path = trained[0], tmp_path / "r.onnx"
    shutil.copyfile(trained[1], path)  # the fixture's export_onnx(model) file: what is tested is the report on it
    q = int8_report(model, path, eval_data="digits", repeats=3)
    assert q["path"] == str(tmp_path / "r.int8.onnx") and (tmp_path / "r.int8.onnx").is_file()
    assert np.isfinite(q["speedup_vs_fp32_onnx"]) and q["speedup_vs_fp32_onnx"] > 0
    scored = evaluate_on(model, "digits")
    assert scored["split"] == "test" and q["accuracy"]["count"] == scored["count"]
    top1 = q["accuracy"]["top1"]
    assert top1["pytorch"] == pytest.approx(scored["top1"], abs=1e-9)
    assert q["top1_change_points"] == pytest.approx(top1["int8"] - top1["pytorch"])
    assert q["thresholds"] == {"max_drop_points": 0.5, "min_speedup": 1.2}
    assert int8_report(model, path, eval_data="digits", eval_limit=40, repeats=1)["accuracy"]["count"] == 40


def test_int8_warning_rule():
    from vitkit.export.int8 import int8_warning

    ok = {"path": "/x/m.int8.onnx", "speedup_vs_fp32_onnx": 1.5, "top1_change_points": -0.5, "eval_data": "digits"}
    assert int8_warning(ok) is None  # a drop of exactly 0.5 points is still fine
    assert int8_warning(ok | {"top1_change_points": 0.8}) is None  # int8 scoring higher is no reason to warn
    assert int8_warning({"path": "m.int8.onnx", "speedup_vs_fp32_onnx": 1.2}) is None  # no eval data: speed only
    drop = int8_warning(ok | {"top1_change_points": -0.67})
    assert drop == ("warning: int8 model m.int8.onnx: top-1 drops 0.67 points on digits (more than 0.5); "
                    "consider shipping the fp32 model")
    slow = int8_warning(ok | {"speedup_vs_fp32_onnx": 1.19})
    assert "only 1.19x the speed of the fp32 ONNX model (under 1.2x)" in slow and "top-1" not in slow
    both = int8_warning(ok | {"speedup_vs_fp32_onnx": 0.9, "top1_change_points": -2.0})
    assert "\n" not in both and "drops 2.00 points" in both and "only 0.90x" in both
    assert int8_warning(ok | {"top1_change_points": -2.0}, max_drop=3.0) is None
    assert int8_warning(ok, min_speedup=2.0).startswith("warning: int8 model m.int8.onnx: only 1.50x")


def test_export_cli_int8_warning_is_one_stderr_line(trained, tmp_path, capsys):
    """Thresholds a measurement cannot meet (1000x) always warn; ones it always meets never do: no timing
    assertion either way. stdout stays JSON; the warning is also in the report."""
    ckpt = vitkit.save_model(trained[0], tmp_path / "pico.safetensors")
    base = ["export", str(ckpt), "--onnx", str(tmp_path / "w.onnx"), "--int8", "--eval-data", "digits",
            "--eval-limit", "100", "--json"]
    assert main(base + ["--int8-min-speedup", "1000"]) == 0
    captured = capsys.readouterr()
    q = json.loads(captured.out)["int8"]
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0] == q["warning"]
    assert lines[0].startswith("warning: int8 model w.int8.onnx: only ") and "(under 1000x)" in lines[0]
    assert main(base + ["--int8-min-speedup", "0", "--int8-max-drop", "100"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["int8"]["warning"] is None
    rc = main(["export", str(ckpt), "--onnx", str(tmp_path / "n.onnx"), "--int8-min-speedup", "2"])
    assert rc == 2 and "only apply with --int8" in capsys.readouterr().err


def test_export_cli_int8_of_the_bundled_model_warns_exactly_when_measured_limits_are_crossed(tmp_path, capsys):
    from vitkit.data import fashion_mnist
    from vitkit.export.int8 import INT8_MAX_DROP_POINTS, INT8_MIN_SPEEDUP, int8_warning

    if fashion_mnist.find_local() is None:
        pytest.skip("Fashion-MNIST not installed")
    assert main(["export", "bundled:fashion-mnist", "--onnx", str(tmp_path / "b.onnx"), "--int8",
                 "--eval-data", "fashion-mnist", "--eval-limit", "300", "--json"]) == 0
    captured = capsys.readouterr()
    q = json.loads(captured.out)["int8"]
    assert q["accuracy"]["count"] == 300 and q["accuracy"]["top1"]["pytorch"] > 85
    drop, speedup = -q["top1_change_points"], q["speedup_vs_fp32_onnx"]
    crossed = drop > INT8_MAX_DROP_POINTS or speedup < INT8_MIN_SPEEDUP
    assert captured.err.strip().splitlines() == ([q["warning"]] if crossed else [])
    assert ("top-1 drops" in (q["warning"] or "")) == (drop > INT8_MAX_DROP_POINTS)
    if drop > 0:  # the measured drop, against a limit just under it
        assert f"top-1 drops {drop:.2f} points on fashion-mnist" in int8_warning(q, max_drop=drop - 0.01)


def test_export_cli_table_has_a_header(trained, tmp_path, capsys, monkeypatch):
    """The human table names its columns (it had an empty header row)."""
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.chdir(tmp_path)  # a short relative path, so the written row does not fold
    vitkit.save_model(trained[0], "pico.safetensors")
    assert main(["export", "pico.safetensors", "--onnx", "t.onnx"]) == 0
    lines = capsys.readouterr().out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    header = [cell.strip() for cell in lines[top + 1].strip("┃ ").split("┃")]
    assert header == ["field", "value"], lines[top + 1]
    assert any(line.startswith("│ written") and "t.onnx" in line for line in lines)
