"""Training on your own images through the CLI: a plain class-folder tree and a CSV manifest of real digits
written as PNG files, with the automatic validation split; what a run is named and records when a preset is
applied to other data or models; the preset-lr guard for a large model; no half-written run folder when setup
fails; `--overwrite` for a finished run; the CPU cost estimate and ETA at 224 px."""
from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit
from vitkit.cli.main import main as cli

PER_CLASS = 6  # 60 digits in 10 class folders: 15% auto split -> 1 per class to val, 5 to train
QUICK = ["--epochs", "1", "--set", "steps_per_epoch=2", "--set", "batch_size=8", "--set", "threads=1",
         "--set", "eval_batch_size=64", "--quiet"]


def _digit_tree(root: Path, per_class: int = PER_CLASS) -> list[tuple[str, str]]:
    """The first `per_class` sklearn digits of each class as 8x8 PNGs in root/<class>/; returns (path, label)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    rows, seen = [], {}
    for i, (img, y) in enumerate(zip(d.images, d.target)):
        if seen.get(y, 0) >= per_class:
            continue
        seen[y] = seen.get(y, 0) + 1
        folder = root / f"digit{y}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.uint8(np.round(img * 255 / 16))).save(folder / f"{i}.png")
        rows.append((f"digit{y}/{i}.png", f"digit{y}"))
    return rows


@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("own") / "digits-folder"
    _digit_tree(root)
    return root


def test_plain_class_folder_trains_with_an_automatic_val_split(digit_folder, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["train", "--data", str(digit_folder), "--out", str(out), *QUICK, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "done" and summary["final"]["split"] == "val"  # no test split: reported on val
    assert summary["best"]["split"] == "val"  # the best checkpoint was chosen on held-out images
    cfg = json.loads((out / "config.json").read_text())
    held = cfg["data"]["split_indices"]["val_from_train"]
    assert cfg["data"]["val"] == len(held) == 10 and cfg["data"]["train"] == 50  # one per class, stratified
    assert cfg["data"]["val_split"] == {"fraction": 0.15, "seed": 0, "auto": True}
    assert cfg["recipe"]["val_fraction"] == 0.15  # recorded, so eval can rebuild the split
    # seeded: a second run with the same seed holds out the same images; another seed, others
    out2 = tmp_path / "run2"
    assert cli(["train", "--data", str(digit_folder), "--out", str(out2), *QUICK, "--seed", "1"]) == 0
    assert json.loads((out2 / "config.json").read_text())["data"]["split_indices"]["val_from_train"] != held
    model = vitkit.load_model(out / "best.safetensors")
    assert model.class_names == [f"digit{i}" for i in range(10)]


def test_csv_manifest_trains_with_an_automatic_val_split(tmp_path, capsys):
    rows = _digit_tree(tmp_path / "imgs")
    manifest = tmp_path / "labels.csv"
    manifest.write_text("path,label\n" + "".join(f"imgs/{p},{y}\n" for p, y in rows))
    out = tmp_path / "run"
    assert cli(["train", "--data", str(manifest), "--out", str(out), *QUICK, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["final"]["split"] == "val" and summary["data"] == f"csv:{manifest}"
    assert len(json.loads((out / "config.json").read_text())["data"]["split_indices"]["val_from_train"]) == 10


def test_readme_finetune_command_on_a_folder(digit_folder, tmp_path, capsys):
    """`vitkit train --recipe finetune --finetune CKPT --data FOLDER`, as the README shows it."""
    ckpt = tmp_path / "pretrained.safetensors"
    vitkit.save_model(vitkit.create_model("vit_pico_patch2_8", num_classes=3), ckpt)
    out = tmp_path / "ft"
    assert cli(["train", "--recipe", "finetune", "--finetune", str(ckpt), "--data", str(digit_folder),
                "--out", str(out), *QUICK, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["recipe"] == "finetune" and summary["final"]["split"] == "val"
    assert vitkit.load_model(out / "last.safetensors").num_classes == 10


def test_readme_own_data_commands_run_as_written(tmp_path, monkeypatch, capsys):
    """The README's own-data commands, end to end and in order, on a `flowers/` tree of real digits: only made
    quick (one epoch of two steps, a one-block 32-wide ViT-Ti/16), with CKPT and my_rose.jpg made here."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Training on your own images", 1)[1].split("\n## ", 1)[0]
    commands = [line for line in re.search(r"```bash\n(.*?)```", section, re.DOTALL)[1].splitlines() if line.strip()]
    assert [shlex.split(c, comments=True)[1] for c in commands] == ["train", "train", "predict", "eval"], commands
    monkeypatch.chdir(tmp_path)
    _digit_tree(tmp_path / "flowers")
    Image.open(next((tmp_path / "flowers" / "digit3").iterdir())).convert("RGB").save("my_rose.jpg")
    small = {"depth": 1, "embed_dim": 32, "num_heads": 2}
    vitkit.save_model(vitkit.create_model("vit_tiny_patch16_224", num_classes=5, **small), "ckpt.safetensors")
    small_args = [a for k, v in small.items() for a in ("--set", f"model.{k}={v}")]
    outputs = {}
    for command in commands:
        argv = [a if a != "CKPT" else "ckpt.safetensors" for a in shlex.split(command, comments=True)][1:]
        if argv[0] == "train":
            argv += QUICK + (small_args if "--model" in argv else [])
        rc = cli(argv + ["--json"])
        out, err = capsys.readouterr()
        assert rc == 0, (command, err)
        outputs[argv[0]] = json.loads(out)
    assert outputs["predict"]["predictions"][0]["image"] == "my_rose.jpg"
    evaluated = outputs["eval"]  # the run's own held-out split: the validation images training carved
    held = json.loads(Path("runs/flowers/config.json").read_text())["data"]["split_indices"]["val_from_train"]
    assert evaluated["split"] == "val" and evaluated["count"] == len(held) == 10, evaluated


def test_too_few_images_per_class_is_one_line_and_leaves_no_folder(tmp_path, capsys):
    root = tmp_path / "tiny"
    _digit_tree(root, per_class=2)
    (root / "digit3" / sorted(p.name for p in (root / "digit3").iterdir())[0]).unlink()  # one digit 3 left
    out = tmp_path / "run"
    assert cli(["train", "--data", str(root), "--out", str(out), *QUICK]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'digit3'" in err and "at least 2 per class" in err, err
    assert not out.exists()


def test_setup_failure_leaves_no_half_written_run_folder(digit_folder, tmp_path, capsys):
    # a data error found while planning the epochs: the folder is never made
    out = tmp_path / "big-batch"
    assert cli(["train", "--data", str(digit_folder), "--out", str(out), *QUICK, "--set", "batch_size=512"]) == 2
    assert "larger than the training set" in capsys.readouterr().err and not out.exists()
    # a failure after the folder was started but before the first optimiser step (the data loader refuses
    # its options): what this run created goes
    out = tmp_path / "loader"
    assert cli(["train", "--data", str(digit_folder), "--out", str(out), *QUICK, "--set", "workers=-1"]) != 0
    capsys.readouterr()
    assert not out.exists()
    # a folder that was there before keeps itself and its other files, only this run's files go
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli(["train", "--data", str(digit_folder), "--out", str(out), *QUICK, "--set", "workers=-1"]) != 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_preset_on_other_data_and_model_is_named_after_them(digit_folder, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli(["train", "--data", str(digit_folder), "--model", "vit_tiny_patch4_28", "--set", "model.depth=1",
                *QUICK, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    run = Path(summary["out"])
    assert run.parent == Path("runs") and run.name.startswith("digits-folder-vit_tiny_patch4_28-"), run
    assert summary["recipe"] == "custom" and summary["based_on"] == "digits"
    assert "expected" not in summary  # the digits preset's 96% target is not this run's
    text = (run / "summary.json").read_text() + (run / "report.md").read_text()
    assert "96%" not in text and "vit_pico" not in text
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["recipe"]["name"] == "custom" and cfg["recipe"]["based_on"] == "digits" and not cfg["recipe"]["expected"]
    assert vitkit.load_model(run / "best.safetensors").provenance["based_on"] == "digits"
    # the preset itself, unchanged, keeps its name, target and runs/<recipe>-<time> folder
    assert cli(["train", *QUICK, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["recipe"] == "digits" and ">= 96%" in summary["expected"]
    assert Path(summary["out"]).name.startswith("digits-2")


def test_preset_lr_is_refused_for_a_large_model(digit_folder, tmp_path, capsys):
    out = tmp_path / "vits"
    assert cli(["train", "--data", str(digit_folder), "--model", "vit_small_patch16_224", "--out", str(out),
                *QUICK, "--set", "steps_per_epoch=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lr 0.003" in err and "'digits' preset" in err and "--lr" in err, err
    assert not out.exists()
    # an lr the user chose passes the guard (the run then stops at the next check: a batch too large)
    assert cli(["train", "--data", str(digit_folder), "--model", "vit_small_patch16_224", "--out", str(out),
                *QUICK, "--lr", "5e-4", "--set", "batch_size=512"]) == 2
    err = capsys.readouterr().err
    assert "preset" not in err and "larger than the training set" in err


def test_out_on_a_finished_run_needs_overwrite(digit_folder, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["train", "--data", str(digit_folder), "--out", str(out), *QUICK]) == 0
    (out / "notes.txt").write_text("mine")
    before = (out / "summary.json").read_text()
    capsys.readouterr()
    assert cli(["train", "--data", str(digit_folder), "--out", str(out), *QUICK, "--seed", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "finished run" in err and "--overwrite" in err, err
    assert (out / "summary.json").read_text() == before
    assert cli(["train", "--data", str(digit_folder), "--out", str(out), *QUICK, "--seed", "1", "--overwrite"]) == 0
    assert json.loads((out / "config.json").read_text())["recipe"]["seed"] == 1
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own files were replaced


def test_cpu_training_at_224px_prints_cost_and_eta(digit_folder, tmp_path, capsys):
    from vitkit.analysis.cost import model_cost

    tiny224 = ["--model", "vit_tiny_patch16_224", "--set", "model.depth=1", "--set", "model.embed_dim=32",
               "--set", "model.num_heads=2"]
    args = ["train", "--data", str(digit_folder), *tiny224, *[a for a in QUICK if a != "--quiet"]]
    # 6 steps: the ETA comes from 3 timed steps after 2 warm-up steps (training/console.py), with 1 left
    assert cli([*args, "--set", "steps_per_epoch=6", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    model = vitkit.load_model(tmp_path / "a" / "last.safetensors")
    c = model_cost(model, batch=8)
    cost = next(line for line in err.splitlines() if line.startswith("cost:"))
    assert f"{c.gmacs_per_image:.2f} GMACs per image" in cost and f"{c.params_total / 1e6:.2f}M params" in cost
    assert "activations for a batch of 8" in cost
    eta = [line for line in err.splitlines() if line.startswith("ETA:")]
    assert len(eta) == 1 and "for the 1 step left" in eta[0], err
    assert err.index("cost:") < err.index("ETA:") < err.index("epoch 1/1")
    # --quiet: neither line, but still the final one
    assert cli([*args, "--out", str(tmp_path / "b"), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "cost:" not in err and "ETA:" not in err and "done: final val" in err
    # small images (the digits preset at 8 px): no cost line
    assert cli(["train", "--data", str(digit_folder), "--out", str(tmp_path / "c"),
                *[a for a in QUICK if a != "--quiet"]]) == 0
    assert "cost:" not in capsys.readouterr().err
