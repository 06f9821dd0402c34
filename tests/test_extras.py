"""Optional features on an install without their extra: one line naming `pip install 'vitkit[EXTRA]'`, exit 2,
never "internal error: ModuleNotFoundError".

A package is made absent the way Python itself reports one: `sys.modules[name] = None` in a fresh interpreter
(conftest's fresh_python, which refuses a package it has already imported) makes `import name` raise ImportError,
before vitkit is imported. Everything else is the real CLI."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

import vitkit
from vitkit import VisionTransformer, ViTConfig

ROOT = Path(__file__).parents[1]


def run_cli_without(fresh_python, blocked: list[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = ("import sys\n"
            "from vitkit.cli.main import main\n"
            f"sys.exit(main({argv!r}))\n")
    env = {k: v for k, v in os.environ.items() if k != "VITKIT_DEBUG"}
    return fresh_python.run(code, env=env, cwd=cwd, blocked=blocked, timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("extras")
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(embed_dim=32, depth=1, num_heads=2, img_size=16, patch_size=8, num_classes=3))
    vitkit.save_model(model, d / "tiny.safetensors", class_names=["a", "b", "c"])
    Image.new("RGB", (16, 16), (120, 30, 200)).save(d / "img.png")
    (d / "placeholder.onnx").write_bytes(b"not read: the runtime is missing")
    return d


CASES = [
    # (blocked packages, argv (files relative to the fixture folder), the extra the message must name)
    (["onnx"], ["export", "tiny.safetensors", "--onnx", "out1.onnx"], "onnx"),
    (["onnxscript"], ["export", "tiny.safetensors", "--onnx", "out2.onnx"], "onnx"),
    (["onnxruntime"], ["export", "tiny.safetensors", "--onnx", "out3.onnx"], "onnx"),
    (["onnxruntime"], ["predict", "placeholder.onnx", "img.png", "--backend", "onnx"], "onnx"),
    (["timm"], ["bench", "--quick"], "bench"),
]


@pytest.mark.parametrize("blocked,argv,extra", CASES, ids=[f"{c[1][0]}-without-{c[0][0]}" for c in CASES])
def test_missing_extra_is_one_line_naming_it(fresh_python, files, blocked, argv, extra):
    res = run_cli_without(fresh_python, blocked, argv, files)
    err = res.stderr.strip()
    assert "internal error" not in err and "Traceback" not in err, err
    assert res.returncode == 2, (res.returncode, err)
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"vitkit {argv[0]}: error:") and f"pip install 'vitkit[{extra}]'" in err, err
    assert blocked[0] in err  # which package is missing
    if argv[0] == "export":  # refused before writing anything, not after exporting without a parity check
        assert not (files / argv[3]).exists()


def test_default_training_data_without_scikit_learn_says_what_to_install(fresh_python, tmp_path):
    """scikit-learn is a core dependency (the default `vitkit train` needs it); an environment that still
    lacks it gets one line, not a traceback."""
    res = run_cli_without(fresh_python, ["sklearn"], ["train", "--out", str(tmp_path / "run"), "--epochs", "1", "--quiet"], tmp_path)
    err = res.stderr.strip()
    assert res.returncode == 2 and "internal error" not in err and len(err.splitlines()) == 1, err
    assert "scikit-learn" in err


def test_extras_declared():
    """Each message above names an extra that exists, and what it installs is what the feature imports."""
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]

    def names(reqs):
        return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in reqs}

    assert names(extras["onnx"]) == {"onnx", "onnxruntime", "onnxscript"}
    assert names(extras["bench"]) == {"timm"}
    assert names(extras["hub"]) == {"huggingface_hub"}
    assert "scikit-learn" in names(extras["data"]) and "scikit-learn" in names(meta["dependencies"])
    dev = extras["dev"]
    assert any(r.replace(" ", "").startswith("vitkit[") and all(e in r for e in ("onnx", "bench", "hub", "data"))
               for r in dev)
    assert {"pytest", "ruff"} <= names(dev)
