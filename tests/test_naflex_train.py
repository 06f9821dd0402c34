"""NaFlex training (training/token_budget.py): steps sized by token budget, whole rounds per epoch, an order that is
a pure function of (seed, epoch) across ranks; a run at the native budget equals the square run; photos of many
shapes train, resume exactly, and the checkpoint evaluates and predicts at its budget; the refusals."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from skimage import data as photos

import vitkit
from vitkit.data.transforms import eval_transform, stack_inputs
from vitkit.errors import ConfigError
from vitkit.inference import evaluate_on, predict_files
from vitkit.layers.naflex import PatchBatch
from vitkit.training.distributed import Dist
from vitkit.training.order import epoch_batches
from vitkit.training.recipes import get_recipe
from vitkit.training.trainer import Trainer


def _recipe(**kw):
    return get_recipe("digits").replace(**(dict(ema=False, val_fraction=0.0, reprob=0.0) | kw))


def test_a_step_holds_batch_size_times_budget_over_its_length_and_epochs_are_whole_rounds():
    r = _recipe(batch_size=32, max_tokens=16, token_lens=(4, 9, 16))
    one = [epoch_batches(1295, r, e, Dist(0, 1, 0)) for e in range(3)]
    assert one[0] == epoch_batches(1295, r, 0, Dist(0, 1, 0))  # a pure function of (seed, epoch)
    for steps in one:
        assert len(steps) == len(one[0]) == 3 * (1295 // (128 + 56 + 32))  # whole rounds: the same every epoch
        sizes = {(len(s[0]), s[0][0][1]) for s in steps}
        assert sizes == {(128, 4), (56, 9), (32, 16)}  # 32 * 16 // length images, all at the step's length
        seen = [i for s in steps for i, _ in s[0]]
        assert len(seen) == len(set(seen))  # no image twice in an epoch
    assert one[0] != one[1]
    # two processes: each step's images split between the ranks, together the one-process step
    two = [epoch_batches(1295, r, 0, Dist(rank, 2, rank)) for rank in (0, 1)]
    for step, a, b in zip(one[0], *two):
        assert sorted(step[0]) == sorted(a[0] + b[0]) and len(a[0]) == len(b[0])


def test_a_naflex_run_at_the_native_budget_is_the_square_run(tmp_path):
    """digits at 8x8 with patch 2 is a 4x4 grid: max_tokens=16 gives every image that grid, no padding, so the run
    is the square one computed through the patch-batch path (the patch kernel as a matmul)."""
    recipe = _recipe(epochs=1)
    Trainer(recipe, tmp_path / "square", quiet=True).run()
    Trainer(recipe.replace(max_tokens=16), tmp_path / "naflex", quiet=True).run()
    a, b = load_file(str(tmp_path / "square" / "last.safetensors")), load_file(str(tmp_path / "naflex" / "last.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-4, rtol=1e-3, msg=k)
    square, naflex = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("square", "naflex"))
    assert square["final"]["top1"] > 15  # it learned something (chance: 10%)
    assert abs(square["final"]["top1"] - naflex["final"]["top1"]) <= 0.6  # one of 359 images at most
    assert vitkit.load_model(tmp_path / "naflex" / "last.safetensors").preprocess.max_tokens == 16


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    """A folder of real photo crops of many shapes (16-64 px a side, aspect 1:4 to 4:1), three classes."""
    root = tmp_path_factory.mktemp("shapes")
    rng = np.random.default_rng(0)
    for name, photo in (("cat", photos.chelsea()), ("coffee", photos.coffee()), ("rocket", photos.rocket())):
        (root / name).mkdir()
        for i in range(40):
            h, w = (int(v) for v in rng.integers(16, 65, 2))
            scale = rng.uniform(2, 4)
            ch, cw = min(int(h * scale), photo.shape[0]), min(int(w * scale), photo.shape[1])
            y, x = rng.integers(0, photo.shape[0] - ch + 1), rng.integers(0, photo.shape[1] - cw + 1)
            Image.fromarray(photo[y:y + ch, x:x + cw]).resize((w, h)).save(root / name / f"{i}.png")
    return root


def _shapes_recipe(data, **kw):
    return _recipe(data=str(data), in_chans=3, batch_size=16, eval_batch_size=16, epochs=2, max_tokens=16,
                   token_lens=(6, 16), lr=2e-3, warmup_epochs=0.5, **kw)


def test_photos_of_many_shapes_train_resume_and_run_at_their_budget(shapes, tmp_path):
    recipe = _shapes_recipe(shapes)
    Trainer(recipe, tmp_path / "a", quiet=True, stop_after_epochs=1).run()
    Trainer(recipe, tmp_path / "a", resume=True, quiet=True).run()
    Trainer(recipe, tmp_path / "b", quiet=True).run()
    a, b = load_file(str(tmp_path / "a" / "last.safetensors")), load_file(str(tmp_path / "b" / "last.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # the resumed run is the uninterrupted one

    model = vitkit.load_model(tmp_path / "b" / "best.safetensors").eval()
    assert (model.preprocess.max_tokens, model.preprocess.token_patch) == (16, 2)
    images = sorted(shapes.glob("*/*.png"))[::10]
    items = [eval_transform(model.preprocess)(Image.open(p).convert("RGB")) for p in images]
    batch = stack_inputs(items)
    assert isinstance(batch, PatchBatch) and len({it.grid for it in items}) > 3 and batch.padded_fraction > 0
    with torch.no_grad():
        together = model(batch)
        for row, it in zip(together, items):  # each image in the padded batch = the image alone at its grid
            gh, gw = it.grid
            alone = it.patches.reshape(gh, gw, 3, 2, 2).permute(2, 0, 3, 1, 4).reshape(1, 3, gh * 2, gw * 2)
            torch.testing.assert_close(row, model(alone)[0], atol=1e-5, rtol=1e-5)
    scores = evaluate_on(model, str(shapes), split="all")
    assert scores["count"] == 120 and scores["top1"] > 50  # three classes: chance is 33%
    preds, errors = predict_files(model, images[:2])
    assert not errors and len(preds) == 2


@pytest.mark.parametrize("changes,message", [
    (dict(mixup=0.8), "MixUp / CutMix"),
    (dict(flexi_patch_sizes=(2, 4)), "flexi_patch_sizes together"),
    (dict(task="mae", task_args={"decoder_dim": 16, "decoder_depth": 1}), "square image batches"),
    (dict(model="resnet18", model_args={}), "own aspect ratio"),
    (dict(model_args={"merge": 2}), "token merging"),
])
def test_what_cannot_train_at_its_own_aspect_ratio_is_refused_in_one_line(changes, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        Trainer(_recipe(epochs=1, steps_per_epoch=1, max_tokens=16, **changes), tmp_path / "run", quiet=True).run()


def test_the_fields_parse_and_check():
    r = get_recipe("digits").override(["max_tokens=16", "token_lens=4,9,16"])
    assert (r.max_tokens, r.token_lens) == (16, (4, 9, 16))
    with pytest.raises(ConfigError, match="token_lens must be whole numbers from 1 to max_tokens=16"):
        get_recipe("digits").override(["max_tokens=16", "token_lens=4,32"])
    with pytest.raises(ConfigError, match="token_lens needs max_tokens"):
        get_recipe("digits").override(["token_lens=4"])
