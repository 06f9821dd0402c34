"""The one eval-split loader (data.datasets.load_eval_split + eval_loader) that `vitkit eval`, the frozen-feature
probes and export's int8 report all score through, on the real digits set."""
from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.data.datasets import eval_loader, eval_split, image_keys, load_data, load_eval_split
from vitkit.errors import DataError


def test_load_eval_split_is_load_data_then_eval_split():
    bundle, split, ds = load_eval_split("digits", channels=1)
    assert split == "test" and bundle.class_names == [str(i) for i in range(10)]
    assert image_keys(ds) == image_keys(eval_split(load_data("digits", channels=1))[1])
    # another split, carved as a training run does
    bundle, split, ds = load_eval_split("digits", channels=1, split="val", seed=3, val_fraction=0.2)
    reference = load_data("digits", channels=1, seed=3, val_fraction=0.2)
    assert split == "val" and image_keys(ds) == image_keys(reference.val) and len(ds) < len(reference.train)


def test_load_eval_split_relabels_onto_a_models_classes():
    _, _, plain = load_eval_split("digits", channels=1)
    reversed_names = [str(i) for i in reversed(range(10))]
    bundle, _, mapped = load_eval_split("digits", channels=1, class_names=reversed_names)
    assert bundle.class_names == reversed_names
    assert torch.equal(torch.as_tensor(mapped.labels), 9 - torch.as_tensor(plain.labels))
    with pytest.raises(DataError, match="not among the model's classes"):
        load_eval_split("digits", channels=1, class_names=["cat", "dog"])


def test_eval_loader_gives_the_models_eval_batches_in_order():
    model = vitkit.create_model("vit_pico_patch2_8")
    _, _, ds = load_eval_split("digits", channels=1)
    batches = list(eval_loader(ds, model.preprocess, batch_size=16, limit=40))
    assert [len(y) for _, y in batches] == [16, 16, 8]
    assert all(x.shape[1:] == model.preprocess.input_size and x.dtype == torch.float32 for x, _ in batches)
    assert torch.equal(torch.cat([y for _, y in batches]), torch.as_tensor(ds.labels[:40]))
    again = next(iter(eval_loader(ds, model.preprocess, batch_size=16)))[0]
    assert torch.equal(again, batches[0][0])  # no randomness: the same images give the same tensors
    assert sum(len(y) for _, y in eval_loader(ds, model.preprocess)) == len(ds)  # no limit: the whole split


def test_in_memory_images_at_the_input_size_take_the_batched_form_with_the_same_tensors():
    from vitkit.data.transforms import eval_transform

    model = vitkit.create_model("vit_pico_patch2_8")  # digits are 8x8: the eval resize leaves them as they are
    _, _, ds = load_eval_split("digits", channels=1)
    loader = eval_loader(ds, model.preprocess, batch_size=16, limit=20)
    assert loader.dataset.batched is not None  # the route this test is about
    x = torch.cat([b for b, _ in loader])
    per_image = eval_transform(model.preprocess)
    expected = torch.stack([per_image(ds[i][0]) for i in range(20)])
    torch.testing.assert_close(x, expected, atol=1e-6, rtol=0)
