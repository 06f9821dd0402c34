"""FlexiViT training (`--set flexi_patch_sizes=...`): each step cuts one of the sizes from the model's one kernel,
resampled in the forward; the gradient reaches that kernel; the run resumes exactly; and the weights so trained
run at the other sizes far better than a model trained at one size and resized afterwards."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.errors import ConfigError
from vitkit.inference import evaluate_on
from vitkit.layers.patch_embed import resample_patch_kernel
from vitkit.training import flexi
from vitkit.training.recipes import get_recipe
from vitkit.training.trainer import Trainer

FLEXI = (2, 4)


def _recipe(**kw):
    return get_recipe("digits").replace(**(dict(epochs=8, ema=False, val_fraction=0.0) | kw))


def test_inside_cutting_the_forward_uses_the_resampled_kernel_and_the_gradient_reaches_the_one_kernel():
    model = vitkit.create_model("vit_pico_patch2_8", in_chans=1, num_classes=10, img_size=8)
    x = torch.randn(3, 1, 8, 8)
    with model.patch_embed.cutting(4):
        out = model(x)
        out.sum().backward()
    assert model.patch_embed.proj.weight.shape[-2:] == (2, 2) and model.patch_embed.cut_size is None
    assert model.patch_embed.proj.weight.grad is not None and model.patch_embed.proj.weight.grad.abs().sum() > 0
    resized = vitkit.create_model("vit_pico_patch2_8", in_chans=1, num_classes=10, img_size=8)
    resized.load_state_dict(model.state_dict())
    resized.set_input_size(patch_size=4)  # the inference path: the same PI-resize, applied once
    torch.testing.assert_close(resized.patch_embed.proj.weight,
                               resample_patch_kernel(model.patch_embed.proj.weight, 4))
    with torch.no_grad(), model.patch_embed.cutting(4):
        torch.testing.assert_close(model(x), resized(x), rtol=1e-5, atol=1e-5)


def test_the_size_of_a_step_is_a_pure_function_of_seed_and_step():
    draws = [flexi.size_for_step((8, 12, 16), 0, s) for s in range(60)]
    assert draws == [flexi.size_for_step((8, 12, 16), 0, s) for s in range(60)]
    assert set(draws) == {8, 12, 16} and draws != [flexi.size_for_step((8, 12, 16), 1, s) for s in range(60)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("flexi")
    Trainer(_recipe(flexi_patch_sizes=FLEXI), root / "flexi", quiet=True).run()
    Trainer(_recipe(), root / "plain", quiet=True).run()
    return root


def test_a_flexi_run_saves_the_native_model_and_runs_well_at_every_size(runs):
    """The point of FlexiViT: at patch 4 (4 tokens instead of 16) the flexi-trained weights keep most of their
    accuracy, while the same recipe trained at patch 2 alone and resized to 4 loses most of it."""
    flex, plain = runs / "flexi" / "last.safetensors", runs / "plain" / "last.safetensors"
    assert vitkit.load_model(flex).cfg.patch_size == 2
    assert json.loads((runs / "flexi" / "config.json").read_text())["recipe"]["flexi_patch_sizes"] == list(FLEXI)
    at = {(name, p): evaluate_on(vitkit.load_model(path, patch_size=p) if p != 2 else vitkit.load_model(path),
                                 "digits")["top1"]
          for name, path in (("flexi", flex), ("plain", plain)) for p in FLEXI}
    # measured (8 epochs, idle 2-core Xeon, 2026-12-03): flexi 61.0% at patch 2, 81.6% at 4; plain 89.1% at 2,
    # 17.3% at 4 (12 epochs on a shared Zen 3: flexi 69.9 / 83.6, plain 85.5 / 17.0).
    # Half of the flexi steps go to patch 4, so at its native size it trails the plain run at this length.
    assert at["flexi", 4] > at["plain", 4] + 30, at
    assert min(at["flexi", 2], at["flexi", 4]) > 50, at


def test_a_flexi_run_resumes_to_the_same_weights(tmp_path):
    recipe = _recipe(flexi_patch_sizes=FLEXI, epochs=2, steps_per_epoch=4)
    Trainer(recipe, tmp_path / "a", quiet=True, stop_after_epochs=1).run()
    Trainer(recipe, tmp_path / "a", resume=True, quiet=True).run()
    Trainer(recipe, tmp_path / "b", quiet=True).run()
    a, b = load_file(str(tmp_path / "a" / "last.safetensors")), load_file(str(tmp_path / "b" / "last.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("changes,message", [
    (dict(flexi_patch_sizes=(3,)), r"flexi_patch_sizes \[3\] do not divide the 8x8 input; sizes that do: 1, 2, 4, 8"),
    (dict(flexi_patch_sizes=(2, 4), model="resnet18", model_args={}), "cannot change its patch size"),
    (dict(flexi_patch_sizes=(2, 4), task="mae", task_args={"decoder_dim": 16, "decoder_depth": 1}),
     "fixed patch grid"),
])
def test_what_cannot_be_cut_is_refused_in_one_line(changes, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        Trainer(_recipe(epochs=1, steps_per_epoch=1, **changes), tmp_path / "run", quiet=True).run()


def test_the_field_parses_from_set():
    assert get_recipe("digits").override(["flexi_patch_sizes=2,4"]).flexi_patch_sizes == (2, 4)
    with pytest.raises(ConfigError, match="flexi_patch_sizes"):
        get_recipe("digits").override(["flexi_patch_sizes=2,0"])
