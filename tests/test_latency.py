"""`vitkit bench --latency`: batch-1 p50/p90/p99 per model and runtime (vitkit.latency), through the real CLI
on a tiny model at a small size: the report's structure, percentiles from its own timed runs, skipped runtimes
with their reasons, top-1 equal to `vitkit eval`'s, the PNG, and bad input as one line."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit import VisionTransformer, ViTConfig
from vitkit.cli.main import main
from vitkit.hardware import detect
from vitkit.latency import percentiles

TINY = ["--models", "vit_pico_patch2_8", "--img-size", "16"]


def test_percentiles_of_known_lists():
    # numpy's linear interpolation between order statistics: rank q/100 * (n - 1)
    assert percentiles(list(range(1, 101))) == pytest.approx({"p50": 50.5, "p90": 90.1, "p99": 99.01})
    assert percentiles([3.0, 1.0, 2.0]) == {"p50": 2.0, "p90": 2.8, "p99": pytest.approx(2.98)}  # order is irrelevant
    assert percentiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p99": 7.0}
    with pytest.raises(ValueError):
        percentiles([])


def test_latency_report_table_json_and_plot(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # with bf16 columns too, 80 columns fold the model's name
    out, png = tmp_path / "lat.json", tmp_path / "lat.png"
    argv = ["bench", "--latency", *TINY, "--runtimes", "torch-fp32,torch-bf16,openvino-bf16", "--runs", "7",
            "--warmup", "1", "--json", str(out), "--plot", str(png)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["batch"] == 1 and report["runs"] == 7 and report["warmup"] == 1 and report["date"]
    assert report["machine"]["cpu_kind"] == detect().kind and report["machine"]["cores"] == os.cpu_count()
    assert set(report["versions"]) == {"torch", "onnxruntime", "openvino"}
    assert report["versions"]["torch"] == torch.__version__
    (entry,) = report["models"]
    model = vitkit.create_model("vit_pico_patch2_8", img_size=16)
    assert entry["params"] == sum(p.numel() for p in model.parameters()) and entry["img_size"] == [16, 16]
    assert entry["gmacs"] > 0
    rows = {r["runtime"]: r for r in report["rows"]}
    assert list(rows) == ["torch-fp32", "torch-bf16", "openvino-bf16"]  # in the order asked
    fp32 = rows["torch-fp32"]
    assert fp32["status"] == "ok" and fp32["reason"] is None
    assert len(fp32["samples_ms"]) == fp32["runs"] == 7 and all(t > 0 for t in fp32["samples_ms"])
    assert {k: fp32[f"{k}_ms"] for k in ("p50", "p90", "p99")} == percentiles(fp32["samples_ms"])
    assert min(fp32["samples_ms"]) <= fp32["p50_ms"] <= fp32["p90_ms"] <= fp32["p99_ms"] <= max(fp32["samples_ms"])
    for rt in ("torch-bf16", "openvino-bf16"):
        if detect().native_bf16:  # a machine with native bf16 runs them
            assert rows[rt]["status"] == "ok" or "pip install" in rows[rt]["reason"]
        else:
            assert rows[rt]["status"] == "skipped" and "native bf16" in rows[rt]["reason"]
            assert "p50_ms" not in rows[rt] and f"skipped {rt}: " in table
    assert "vit_pico_patch2_8" in table and "torch-fp32" in table and f"{fp32['p50_ms']:.2f}" in table
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (800, 500)


def test_latency_json_on_stdout(capsys):
    assert main(["bench", "--latency", *TINY, "--runtimes", "torch-fp32", "--runs", "3", "--warmup", "1",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [r["runtime"] for r in report["rows"]] == ["torch-fp32"] and report["rows"][0]["runs"] == 3


@pytest.fixture(scope="module")
def classified(tmp_path_factory):
    """A tiny 3-class ViT checkpoint and a folder of 3 x 4 coloured images, 16 px."""
    d = tmp_path_factory.mktemp("latency")
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(embed_dim=32, depth=1, num_heads=2, img_size=16, patch_size=8, num_classes=3))
    vitkit.save_model(model, d / "tiny.safetensors", class_names=["a", "b", "c"])
    rng = np.random.default_rng(0)
    for c in "abc":
        (d / "data" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(d / "data" / c / f"{i}.png")
    return d


def test_top1_of_torch_fp32_equals_vitkit_eval(classified, capsys):
    ckpt, data = str(classified / "tiny.safetensors"), str(classified / "data")
    assert main(["eval", ckpt, "--data", data, "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["count"] == 12
    argv = ["bench", "--latency", "--models", ckpt, "--runtimes", "torch-fp32", "--runs", "2", "--warmup", "1",
            "--data", data, "--limit", "100", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = report["rows"]
    assert row["eval_count"] == 12 and row["top1"] == pytest.approx(evaluated["top1"])
    assert main(argv[:-3] + ["--limit", "5", "--json"]) == 0  # the first 5 images only
    assert json.loads(capsys.readouterr().out)["rows"][0]["eval_count"] == 5


def test_latency_plot_with_top1_is_written(classified, tmp_path, capsys):
    png = tmp_path / "acc.png"
    assert main(["bench", "--latency", "--models", str(classified / "tiny.safetensors"), "--runtimes", "torch-fp32",
                 "--runs", "2", "--warmup", "1", "--data", str(classified / "data"), "--plot", str(png)]) == 0
    assert "top-1" in capsys.readouterr().out
    with Image.open(png) as im:
        assert im.format == "PNG" and im.size == (800, 500)


def test_a_run_folders_checkpoint_is_called_by_its_folder_in_the_table(classified, capsys):
    run = classified / "edge-run"
    run.mkdir()
    (run / "best.safetensors").write_bytes((classified / "tiny.safetensors").read_bytes())
    assert main(["bench", "--latency", "--models", str(run / "best.safetensors"), str(classified / "tiny.safetensors"),
                 "--runtimes", "torch-fp32", "--runs", "2", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "edge-run" in out and "tiny" in out and "safetensors" not in out and str(classified) not in out


def test_missing_runtime_package_is_skipped_with_the_install_line(capsys, monkeypatch):
    for name in [m for m in sys.modules if m == "onnxruntime" or m.startswith("onnxruntime.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what `import onnxruntime` meets when not installed
    assert main(["bench", "--latency", *TINY, "--runtimes", "torch-fp32,onnx-int8", "--runs", "2", "--warmup", "1",
                 "--json"]) == 0
    rows = {r["runtime"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["torch-fp32"]["status"] == "ok"
    assert rows["onnx-int8"]["status"] == "skipped" and "pip install 'vitkit[onnx]'" in rows["onnx-int8"]["reason"]
    assert "onnxruntime" in rows["onnx-int8"]["reason"]


@pytest.mark.parametrize("extra,says", [
    (["--runtimes", "torch-fp33"], "unknown runtime 'torch-fp33'"),
    (["--runs", "0"], "--runs must be at least 1"),
    (["--models", "no_such_model_xyz"], "no_such_model_xyz"),
    (["--limit", "3"], "--limit counts images of --data"),
], ids=["unknown-runtime", "runs-0", "unknown-model", "limit-without-data"])
def test_bad_latency_input_is_one_line(capsys, extra, says):
    assert main(["bench", "--latency", *TINY, "--runs", "2", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and says in err, err
    assert err.startswith("vitkit bench: error:")


def test_latency_flags_without_latency_are_refused(capsys):
    assert main(["bench", "--runtimes", "torch-fp32"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--runtimes applies to --latency only" in err
