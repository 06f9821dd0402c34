"""What a run is built from before its loop starts: the data (a validation split carved from train where it
has none), the model for it (from the recipe, or the checkpoint to fine-tune),
and the three datasets with their transforms. (The trainer sets the fast paths on the whole task afterwards.)"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..data.datasets import DataBundle, Transformed, default_val_fraction, load_data
from ..data.transforms import batched_eval_transform, batched_train_transform, eval_transform, train_transform
from . import models as model_io
from .recipes import Recipe, check_preset_lr


@dataclass
class RunParts:
    recipe: Recipe  # with the validation fraction it ran with
    data: DataBundle
    model: nn.Module
    train_set: Transformed
    eval_set: Transformed  # the split that picks best.safetensors: val, else test
    eval_split: str
    test_set: Transformed | None


def model_name(recipe: Recipe, model: nn.Module, finetune: str | None) -> str:
    return recipe.model if not finetune else f"{model.provenance.get('arch') or 'model'} from {finetune}"


def build_run(recipe: Recipe, *, finetune: str | None, strict: bool, device: torch.device,
              check_lr: bool) -> RunParts:
    """`check_lr`: the lr came from a preset, not chosen for this model: refuse it when too high for a large
    model (recipes.check_preset_lr)."""
    r = recipe
    # a folder or manifest without a val split gets one carved from train (recorded in the recipe and in
    # config.json's data.split_indices), so the best checkpoint is chosen on images it did not train on
    val_fraction = r.val_fraction or default_val_fraction(r.data)
    data = load_data(r.data, seed=r.seed, val_fraction=val_fraction, strict=strict, subset=r.train_subset,
                     eval_subset=r.eval_subset, options=r.data_args)
    if val_fraction != r.val_fraction and "val_split" in data.info:
        data.info["val_split"]["auto"] = True
        r = r.replace(val_fraction=val_fraction)
    model = model_io.build(r, data.num_classes, data.channels, data.image_size, finetune)
    if check_lr:
        check_preset_lr(r, sum(p.numel() for p in model.parameters()), model_name(r, model, finetune))
    model.class_names = data.class_names
    if r.max_tokens:  # NaFlex: the preprocessing (and so every transform below, and the checkpoint) at a token budget
        from ..api import set_max_tokens

        set_max_tokens(model, r.max_tokens)
    data.set_channels(model_io.in_chans(model))
    model.to(device)
    pre = model.preprocess
    ev, ev_batched = eval_transform(pre), batched_eval_transform(pre, data.image_size)
    eval_split = "val" if data.val is not None else "test"
    train_set = Transformed(data.train, train_transform(pre, r, data.image_size), seed=r.seed,
                            batched=batched_train_transform(pre, r, data.image_size))
    return RunParts(r, data, model, train_set,
                    Transformed(data.val if data.val is not None else data.test, ev, deterministic=False,
                                batched=ev_batched), eval_split,
                    Transformed(data.test, ev, deterministic=False, batched=ev_batched) if data.test is not None else None)
