"""Bad command lines: a non-zero exit, one error line on stderr, never a traceback; model input errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import vitkit
from vitkit.cli.main import build_parser, main
from vitkit.errors import ConfigError

_VITKIT = Path(sys.executable).parent / "vitkit"
CMD = [str(_VITKIT)] if _VITKIT.exists() else [sys.executable, "-m", "vitkit"]


def _subcommands() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return set(sub.choices)


def need(name: str) -> None:
    assert name in _subcommands(), f"`vitkit {name}` is missing from the CLI"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    vitkit.save_model(vitkit.create_model("vit_pico_patch2_8"), d / "pico.safetensors")
    (d / "notes.jpg").write_text("not an image\n")
    (d / "empty.safetensors").write_bytes(b"")
    (d / "text.pth").write_text("hello")
    (d / "a_file").write_text("x")
    return d


def _check_one_line(rc: int, err: str, argv) -> str:
    assert rc not in (0, None), f"{argv}: exit code {rc}"
    assert "Traceback" not in err, f"{argv}: {err}"
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, f"{argv}: stderr is {len(lines)} lines: {err!r}"
    assert "error" in lines[0] and "internal error" not in lines[0], f"{argv}: {lines[0]}"
    return lines[0]


# (subcommand, argv with {d} = fixture folder, text the message must contain)
USER_ERRORS = [
    ("convert", ["convert", "{d}/missing.pth", "{d}/out.safetensors"], "no such file"),
    ("convert", ["convert", "{d}/pico.safetensors", "{d}/out.safetensors", "--model", "vit_nonexistent_9"],
     "unknown model"),
    ("convert", ["convert", "{d}/empty.safetensors", "{d}/out.safetensors"], "empty"),
    ("convert", ["convert", "{d}/text.pth", "{d}/out.safetensors"], "not a readable"),
    ("convert", ["convert", "{d}", "{d}/out.safetensors"], "directory without"),
    ("convert", ["convert", "{d}/pico.safetensors", "{d}/a_file/out.safetensors"], "could not write"),
    ("cost", ["cost", "vit_base_patch16_224", "--img-size", "30"], "divisible"),
    ("cost", ["cost", "vit_nonexistent_9"], "unknown model"),
    ("explain", ["explain", "{d}/pico.safetensors", "{d}/missing.png"], "no such file"),
    ("explain", ["explain", "{d}/pico.safetensors", "{d}/notes.jpg"], "not an image"),
    ("explain", ["explain", "{d}/missing.safetensors", "{d}/notes.jpg"], "no such file"),
    ("analyze", ["analyze", "{d}/missing.safetensors", "--data", "{d}", "--out", "{d}/an"], "no such file"),
    ("train", ["train", "--model", "vit_nonexistent_9", "--out", "{d}/run1"], "unknown model"),
    ("train", ["train", "--data", "{d}/no_such_folder", "--out", "{d}/run2"], "no_such_folder"),
    ("train", ["train", "--set", "lrr=3", "--out", "{d}/run3"], "unknown recipe field"),
    ("train", ["train", "--img-size", "9", "--out", "{d}/run4"], "divisible"),
    ("predict", ["predict", "{d}/pico.safetensors", "{d}/missing.png"], "no such file"),
    ("predict", ["predict", "bundled:nope", "{d}/notes.jpg"], "no bundled checkpoint"),
    ("eval", ["eval", "{d}/missing.safetensors"], "no such file"),
    ("export", ["export", "{d}/missing.safetensors", "--onnx", "{d}/m.onnx"], "no such file"),
]

ARGPARSE_ERRORS = [
    ("cost", ["cost", "vit_base_patch16_224", "--img-size", "abc"]),
    ("cost", ["cost", "vit_base_patch16_224", "--batch", "0"]),
    ("cost", ["cost", "vit_base_patch16_224", "--dtype", "fp8"]),
    ("convert", ["convert"]),
    ("train", ["train", "--batch-size", "0"]),
    ("train", ["train", "--epochs", "-1"]),
    ("predict", ["predict", "{d}/pico.safetensors", "x.png", "--top-k", "0"]),
    (None, ["no-such-command"]),
]


def _fill(argv, d):
    return [a.format(d=d) for a in argv]


@pytest.mark.parametrize("cmd,argv,expect", USER_ERRORS, ids=[" ".join(a[:1] + a[-1:]) for _, a, _ in USER_ERRORS])
def test_user_errors_in_process(files, capsys, cmd, argv, expect):
    need(cmd)
    argv = _fill(argv, files)
    rc = main(argv)
    line = _check_one_line(rc, capsys.readouterr().err, argv)
    assert expect in line.lower(), line


@pytest.mark.parametrize("cmd,argv", ARGPARSE_ERRORS)
def test_argument_errors_in_process(capsys, cmd, argv):
    if cmd:
        need(cmd)
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # argparse's own errors: one `error:` line, optionally after the usage synopsis
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err


def test_real_processes(files):
    """The same through the installed entry point: exit status 2, one line, no traceback."""
    picked = [USER_ERRORS[1], USER_ERRORS[9]]  # an unknown model, a text file named .jpg
    procs = []
    for cmd, argv, expect in picked:
        if cmd in _subcommands():
            argv = _fill(argv, files)
            p = subprocess.Popen(CMD + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=dict(os.environ, OMP_NUM_THREADS="1"))
            procs.append((p, argv, expect))
    assert procs
    for p, argv, expect in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 2, (argv, err)
        assert expect in _check_one_line(p.returncode, err, argv).lower()
    assert not (files / "out.safetensors").exists()


# ------------------------------------------------------------------------------------------ model inputs
@pytest.fixture(scope="module")
def pico_model():
    return vitkit.create_model("vit_pico_patch2_8").eval()  # 1 channel, patch 2, 8x8


@pytest.mark.parametrize("shape,match", [
    ((2, 3, 8, 8), r"\[batch, 1, H, W\]"),  # RGB into a gray model
    ((1, 8, 8), r"\[batch, 1, H, W\]"),  # no batch dimension
    ((2, 1, 9, 8), "not divisible by the patch size"),
    ((2, 1, 8, 7), "not divisible by the patch size"),
])
def test_forward_bad_input_is_config_error(pico_model, shape, match):
    with pytest.raises(ConfigError, match=match) as e, torch.no_grad():
        pico_model(torch.zeros(shape))
    assert "\n" not in str(e.value)


def test_bad_sizes_at_construction():
    with pytest.raises(ConfigError, match="divisible"):
        vitkit.create_model("vit_pico_patch2_8", img_size=9)
    with pytest.raises(ConfigError, match="unknown model"):
        vitkit.create_model("vit_nonexistent_9")
