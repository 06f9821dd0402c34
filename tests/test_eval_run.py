"""`vitkit eval RUN` on the data a run trained on: a plain class folder, a CSV manifest and a built-in set.
Without `--data` it scores the run's own held-out split (test when the data has one, else the validation
split training carved), and `--split val` carves exactly the images training held out (the indices in
config.json), from any working directory; scoring images the model trained on says so in one line."""
from __future__ import annotations

import json
import os

import pytest
import torch
from torch.utils.data import DataLoader

import vitkit
from test_own_data import QUICK, _digit_tree
from vitkit.cli.main import main as cli
from vitkit.data.datasets import Transformed, load_data
from vitkit.data.transforms import eval_transform
from vitkit.training.evaluate import evaluate


def _eval(capsys, *argv) -> tuple[dict, list[str]]:
    """`vitkit eval ... --json` -> (its result, its stderr lines)."""
    rc = cli(["eval", *map(str, argv), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out), [line for line in err.splitlines() if line.strip()]


def _loss_on(model, images) -> float:
    """The model's mean cross-entropy on exactly these (image, label) samples: which images were scored."""
    loader = DataLoader(Transformed(images, eval_transform(model.preprocess), deterministic=False), batch_size=64)
    return evaluate(model, loader, model.num_classes, torch.device("cpu"))["loss"]


@pytest.fixture(scope="module", params=["folder", "csv"])
def own_run(request, tmp_path_factory):
    """A run trained from a relative path, as a user types it: `vitkit train --data ds --out runs/ds`.
    -> (working directory, data spec as typed, run folder)"""
    work = tmp_path_factory.mktemp(f"own-{request.param}")
    rows = _digit_tree(work / "ds")
    spec = "ds"
    if request.param == "csv":
        (work / "labels.csv").write_text("path,label\n" + "".join(f"ds/{p},{y}\n" for p, y in rows))
        spec = "labels.csv"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        assert cli(["train", "--data", spec, "--model", "vit_pico_patch2_8", "--out", "runs/ds", *QUICK]) == 0
    return work, spec, work / "runs" / "ds"


def test_eval_run_scores_the_carved_validation_split(own_run, tmp_path, monkeypatch, capsys):
    work, spec, run = own_run
    held = json.loads((run / "config.json").read_text())["data"]["split_indices"]["val_from_train"]
    model = vitkit.load_model(run / "best.safetensors")
    unsplit = load_data(work / spec, channels=model.preprocess.input_size[0]).train  # every image, training's order
    expected_loss = _loss_on(model, unsplit.subset(held))
    monkeypatch.chdir(tmp_path)  # another working directory: the recorded data path still resolves
    res, err = _eval(capsys, run)
    assert res["split"] == "val" and res["count"] == len(held) == 10, res
    assert res["data"].endswith(str(work / spec)) and res["seed"] == 0 and res["val_fraction"] == 0.15
    assert res["loss"] == pytest.approx(expected_loss, rel=1e-5)  # exactly the images training held out
    assert not err, err  # held-out images only: no warning
    # --data naming the same data (relative, from the training directory) and --split val: the same split
    monkeypatch.chdir(work)
    for extra in ([], ["--split", "val"]):
        res, err = _eval(capsys, "runs/ds", "--data", spec, *extra)
        assert res["split"] == "val" and res["count"] == 10 and not err, (extra, res, err)
        assert res["loss"] == pytest.approx(expected_loss, rel=1e-5)


def test_eval_run_says_which_split_and_how_many_images(own_run, monkeypatch, capsys):
    work, spec, run = own_run
    monkeypatch.chdir(work)
    assert cli(["eval", "runs/ds"]) == 0
    out = capsys.readouterr().out
    assert "val split: 10 images" in out and "held out from training" in out, out


def test_scoring_training_images_prints_one_warning_line(own_run, monkeypatch, capsys):
    work, spec, run = own_run
    monkeypatch.chdir(work)
    res, err = _eval(capsys, "runs/ds", "--split", "train")
    assert res["count"] == 50 and len(err) == 1 and "50 of the 50 images" in err[0] and "trained on" in err[0], err
    res, err = _eval(capsys, "runs/ds", "--split", "all")
    assert res["count"] == 60 and len(err) == 1 and "50 of the 60 images" in err[0], err
    # another seed carves another validation split: the images of it that training used are counted
    held0 = set(json.loads((run / "config.json").read_text())["data"]["split_indices"]["val_from_train"])
    held1 = set(load_data(spec, seed=1, val_fraction=0.15).info["split_indices"]["val_from_train"])
    overlap = len(held1 - held0)
    assert overlap > 0  # the check below can fail
    res, err = _eval(capsys, "runs/ds", "--seed", "1", "--split", "val")
    assert res["count"] == 10 and len(err) == 1 and f"{overlap} of the 10 images" in err[0], err


def test_eval_run_on_a_builtin_set_scores_test_and_reproduces_val(tmp_path, capsys):
    run = tmp_path / "digits-run"
    assert cli(["train", "--recipe", "digits", "--seed", "2", "--set", "val_fraction=0.1", "--out", str(run),
                *QUICK]) == 0
    capsys.readouterr()
    model = vitkit.load_model(run / "best.safetensors")
    res, err = _eval(capsys, run)  # the held-out test split of the run's seed
    test = load_data("digits", seed=2).test
    assert res["split"] == "test" and res["count"] == len(test) and res["seed"] == 2 and not err, (res, err)
    assert res["loss"] == pytest.approx(_loss_on(model, test), rel=1e-5)
    held = json.loads((run / "config.json").read_text())["data"]["split_indices"]["val_from_train"]
    res, err = _eval(capsys, run, "--split", "val")
    unsplit = load_data("digits", seed=2).train
    assert res["split"] == "val" and res["count"] == len(held) and not err, (res, err)
    assert res["loss"] == pytest.approx(_loss_on(model, unsplit.subset(held)), rel=1e-5)
    # another seed's test split holds images this run trained on: said in one line
    res, err = _eval(capsys, run, "--seed", "0")
    assert res["split"] == "test" and len(err) == 1 and "trained on" in err[0], err


def test_changed_data_since_training_is_said(tmp_path, monkeypatch, capsys):
    """Images added after training move the carved split off the recorded indices: one line says so."""
    root = tmp_path / "ds"
    _digit_tree(root)
    run = tmp_path / "run"
    assert cli(["train", "--data", str(root), "--model", "vit_pico_patch2_8", "--out", str(run), *QUICK]) == 0
    capsys.readouterr()
    extra = sorted((root / "digit0").iterdir())[0]
    (root / "digit0" / ("0" + extra.name)).write_bytes(extra.read_bytes())  # a seventh digit 0, first in order
    res, err = _eval(capsys, run)
    assert res["split"] == "val" and len(err) == 1 and "changed since" in err[0], err
    assert os.fspath(root) in err[0]


def test_a_user_folder_named_like_a_canvas_set_is_scored(own_run, tmp_path, monkeypatch, capsys):
    """Only the built-in table says a set is a segmentation set: a class folder called canvas-mine is data."""
    import shutil

    work, _, run = own_run
    folder = shutil.copytree(work / "ds", tmp_path / "canvas-mine")
    monkeypatch.chdir(tmp_path)  # as a user types it: --data canvas-mine
    res, _ = _eval(capsys, run, "--data", "canvas-mine")
    assert res["count"] == sum(1 for p in folder.rglob("*.png"))
