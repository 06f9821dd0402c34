"""The batched train / eval pipelines (data.transforms.BatchedTransform) on real images (scikit-learn's digits,
8x8 gray, in memory): the eval form gives the per-image eval transform's tensors; the train form's draws are a
pure function of (seed, epoch, index), whatever the batch or the loader; each augmented image is a flip and / or
a window of the padded original; random erasing zeroes one box drawn as torchvision draws it; the forms exist only
where every per-image op has a batched form."""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from vitkit.data.datasets import Transformed, load_data
from vitkit.data.transforms import (
    batched_eval_transform,
    batched_train_transform,
    collate,
    eval_transform,
    seeded_uniforms,
    train_transform,
)
from vitkit.models.config import Preprocess
from vitkit.training.recipes import Recipe


def digits():
    data = load_data("digits", seed=0)
    return data.train, data.image_size  # TensorImages [N, 1, 8, 8] uint8


def pre_for(channels: int, **kw) -> Preprocess:
    return Preprocess(**{"mean": (0.3,) * channels, "std": (0.6,) * channels, "crop_pct": 1.0,
                         "input_size": (channels, 8, 8)} | kw)


def normalised(images: torch.Tensor, pre: Preprocess) -> torch.Tensor:
    mean, std = torch.tensor(pre.mean).view(1, -1, 1, 1), torch.tensor(pre.std).view(1, -1, 1, 1)
    return (images.float() / 255 - mean) / std


def test_eval_form_equals_the_per_image_eval_transform_with_channel_matching():
    ds, size = digits()
    idx = list(range(0, 300, 3))
    for channels in (1, 3):  # a gray model, and a colour one fed gray images
        pre = pre_for(channels)
        batched = batched_eval_transform(pre, size)
        assert batched is not None
        per_image = torch.stack([eval_transform(pre)(ds[i][0]) for i in idx])
        out = collate(Transformed(ds, eval_transform(pre), deterministic=False, batched=batched).__getitems__(idx))
        assert out[0].shape == (len(idx), channels, 8, 8)
        assert (out[0] - per_image).abs().max() < 1e-6
        assert out[1].tolist() == [int(ds.labels[i]) for i in idx]


def test_no_batched_form_where_an_op_has_none():
    _, size = digits()
    assert batched_eval_transform(pre_for(1, crop_pct=0.8), size) is None  # resize to 10, centre crop
    assert batched_eval_transform(pre_for(1), (28, 28)) is None  # images not at the input size
    base = Recipe(crop="none", hflip=0.5)
    assert batched_train_transform(pre_for(1), base, size) is not None
    assert batched_train_transform(pre_for(1), base.replace(reprob=0.25), size) is not None
    for changes in ({"crop": "rrc"}, {"auto_augment": "trivial"}):
        assert batched_train_transform(pre_for(1), base.replace(**changes), size) is None, changes
    assert batched_train_transform(pre_for(1), base, (28, 28)) is None


def test_train_draws_are_per_sample_whatever_the_batch_or_the_loader():
    ds, size = digits()
    pre = pre_for(1)
    recipe = Recipe(crop="pad", crop_padding=2, hflip=0.5)
    train = Transformed(ds, train_transform(pre, recipe, size), seed=3,
                        batched=batched_train_transform(pre, recipe, size))
    a = collate(train.__getitems__(list(range(64))))[0]
    b = collate(train.__getitems__(list(range(63, -1, -1))))[0].flip(0)  # the same samples, another order
    one = torch.stack([train[i][0] for i in range(64)])  # one at a time
    assert torch.equal(a, b) and torch.equal(a, one)
    loader = DataLoader(train, batch_sampler=[list(range(64))], num_workers=1, collate_fn=collate)
    assert torch.equal(next(iter(loader))[0], a)  # a worker process draws the same
    train.epoch = 1
    assert not torch.equal(collate(train.__getitems__(list(range(64))))[0], a)  # another epoch, other draws
    other = Transformed(ds, train.transform, seed=4, batched=train.batched)
    assert not torch.equal(collate(other.__getitems__(list(range(64))))[0], a)  # another seed, other draws


def test_train_flip_and_pad_crop_are_what_the_recipe_names():
    ds, size = digits()
    pre = pre_for(1)
    n = len(ds)
    raw = normalised(ds.images, pre)  # [N, 1, 8, 8]
    flip_only = Recipe(crop="none", hflip=0.5)
    out = Transformed(ds, train_transform(pre, flip_only, size), batched=batched_train_transform(pre, flip_only, size))
    x = collate(out.__getitems__(list(range(n))))[0]
    same = (x == raw).flatten(1).all(1)
    flipped = (x == raw.flip(-1)).flatten(1).all(1)
    assert bool((same | flipped).all())
    symmetric = (raw == raw.flip(-1)).flatten(1).all(1)
    rate = flipped[~symmetric].float().mean().item()
    sigma = (0.25 / int((~symmetric).sum())) ** 0.5
    assert abs(rate - 0.5) < 5 * sigma, rate  # p = 0.5, within five standard deviations

    pad = Recipe(crop="pad", crop_padding=2, hflip=0.0)
    out = Transformed(ds, train_transform(pre, pad, size), batched=batched_train_transform(pre, pad, size))
    x = collate(out.__getitems__(list(range(200))))[0]
    padded = torch.nn.functional.pad(ds.images[:200], [2] * 4)  # zero padding, as v2.RandomCrop(padding=2)
    offsets = set()
    for k in range(200):
        windows = [(dy, dx) for dy in range(5) for dx in range(5)
                   if torch.equal(x[k], normalised(padded[k:k + 1, :, dy:dy + 8, dx:dx + 8], pre)[0])]
        assert windows, k  # every output is a window of its padded image
        offsets.update(windows)
    assert len(offsets) == 25  # and every one of the 5 x 5 offsets is drawn


def test_a_seeds_draws_begin_with_its_single_draw():
    seeds = [0, 1, 2**62 + 5]
    many = seeded_uniforms(seeds, 4, 40)
    assert many.shape == (3, 40) and torch.equal(many[:, 0], seeded_uniforms(seeds, 4))
    assert len(set(many.flatten().tolist())) == 120 and 0 <= many.min() and many.max() < 1


def erased_boxes(x: torch.Tensor, clean: torch.Tensor) -> list[tuple[int, int] | None]:
    """Each image's erased box (h, w), None where nothing is erased; asserts that what differs from the clean
    image is one axis-aligned box of zeros (the pre_for mean makes no clean pixel exactly 0)."""
    boxes = []
    for img, ref in zip(x[:, 0], clean[:, 0]):
        assert bool((ref != 0).all())
        zero = img == 0
        assert torch.allclose(img[~zero], ref[~zero], atol=1e-6)  # the rest is untouched
        if not zero.any():
            boxes.append(None)
            continue
        rows, cols = zero.any(1).nonzero()[:, 0], zero.any(0).nonzero()[:, 0]
        h, w = int(rows[-1] - rows[0] + 1), int(cols[-1] - cols[0] + 1)
        assert int(zero.sum()) == h * w  # one full rectangle
        boxes.append((h, w))
    return boxes


def test_random_erasing_batched_is_torchvisions_draw_on_one_box():
    ds, size = digits()
    pre = pre_for(1)
    recipe = Recipe(crop="none", hflip=0.0, reprob=0.5)
    clean = normalised(ds.images, pre)  # [N, 1, 8, 8]
    idx = list(range(len(ds)))
    stats = {}
    for form, batched in (("batched", batched_train_transform(pre, recipe, size)), ("per image", None)):
        out = Transformed(ds, train_transform(pre, recipe, size), seed=1, batched=batched)
        boxes = []
        for epoch in range(3):
            out.epoch = epoch
            boxes += erased_boxes(collate(out.__getitems__(idx))[0], clean)
        hit = [b for b in boxes if b is not None]
        assert all(h < 8 and w < 8 for h, w in hit)  # torchvision's "fits" rule
        area = torch.tensor([h * w for h, w in hit], dtype=torch.float64)
        assert 1 <= area.min() and area.max() <= round(0.33 * 64 * 1.2)  # scale (0.02, 0.33), with rounding
        stats[form] = (len(hit) / len(boxes), area.mean().item(), area.std().item() / len(hit) ** 0.5, len(boxes))
    (rate_b, mean_b, se_b, n), (rate_p, mean_p, se_p, _) = stats["batched"], stats["per image"]
    sigma = (2 * 0.25 / n) ** 0.5
    assert abs(rate_b - 0.5) < 5 * sigma and abs(rate_b - rate_p) < 5 * sigma, (rate_b, rate_p)
    assert abs(mean_b - mean_p) < 5 * (se_b ** 2 + se_p ** 2) ** 0.5, (mean_b, mean_p)  # the same box sizes
