"""Whole models around an image tower (MAE's encoder + decoder, DINO's backbone + head, the CLIP pair) share one
config part (`TowerConfig`: size, channels and ViT options go to the tower) and one model part (`ImageTowerModel`:
the model protocol answered by the tower), both in models/towers.py. Checked over the registry, on tiny models."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import vitkit
from test_models_contract import tiny_overrides
from vitkit.errors import ConfigError
from vitkit.models.registry import FAMILIES
from vitkit.models.towers import ImageTowerModel, TowerConfig

# every family whose model declares a tower to load on its own (load_model(path, tower="image"))
TOWER_FAMILIES = sorted(name for name, fam in FAMILIES.items() if getattr(fam.model, "towers", None))


def test_the_whole_model_families_are_the_ones_with_a_tower():
    assert {"mae", "dino", "clip"} <= set(TOWER_FAMILIES)


@pytest.mark.parametrize("family", TOWER_FAMILIES)
def test_tower_families_share_the_config_and_model_parts(family):
    fam = FAMILIES[family]
    assert issubclass(fam.config, TowerConfig) and issubclass(fam.model, ImageTowerModel)
    module_attr, field = fam.model.towers["image"]
    assert fam.model.image_attr == module_attr and fam.config.tower_field == field


@pytest.mark.parametrize("family", TOWER_FAMILIES)
def test_the_config_is_its_towers_size_and_takes_vit_options(family):
    name = vitkit.list_models(family=family)[0]
    cfg = vitkit.create_model(name, **tiny_overrides(name)).cfg
    tower = getattr(cfg, cfg.tower_field)
    assert (cfg.img_size, cfg.in_chans) == (tower.img_size, tower.in_chans)
    side = 2 * tower.img_size[0]
    bigger = cfg.replace(img_size=side, in_chans=1)  # ViT field names go to the tower
    assert getattr(bigger, cfg.tower_field).img_size == (side, side) and bigger.img_size == (side, side)
    assert bigger.in_chans == 1 and type(bigger) is type(cfg)
    with pytest.raises(ConfigError, match=r"unknown model option\(s\) \['not_an_option'\].*image tower's"):
        cfg.replace(not_an_option=1)
    read_back = dataclasses.replace(cfg, **{cfg.tower_field: tower.to_dict()})  # a saved file's dict
    assert read_back.tower_config == tower and read_back == cfg
    with pytest.raises(ConfigError, match=f"its {cfg.tower_field} must be a ViT config, got int"):
        dataclasses.replace(cfg, **{cfg.tower_field: 3})


@pytest.mark.parametrize("family", TOWER_FAMILIES)
def test_the_model_protocol_is_answered_by_the_tower(family):
    torch.manual_seed(0)
    name = vitkit.list_models(family=family)[0]
    model = vitkit.create_model(name, **tiny_overrides(name)).eval()
    module_attr = model.image_attr
    tower = getattr(model, module_attr)
    assert model.image_model is tower
    assert [e["module"] for e in model.feature_info] == [f"{module_attr}.{e['module']}" for e in tower.feature_info]
    assert {f"{module_attr}.{n}" for n in tower.no_weight_decay()} <= model.no_weight_decay()
    x = torch.randn(2, model.cfg.in_chans, *model.cfg.img_size)
    with torch.no_grad():
        assert torch.equal(model.forward_features(x), tower.forward_features(x))
    model.class_names = list("abcde")
    model.reset_classifier(3)
    assert model.num_classes == model.cfg.num_classes == 3 and model.class_names is None  # 5 names no longer fit
    with torch.no_grad():
        assert model(x).shape == (2, 3)
