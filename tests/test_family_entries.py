"""Family entries carry what is particular to a family (issue 21 item 1): how its config is read off a foreign
file's weights when the importer gives none (`infer_config`), what makes two configs one architecture for
preprocessing (`shape_key`), the short shape of a changed architecture (`describe_shape`) and the check of
what a source states (`check_hints`); vitkit.api asks the entry and names no family.

The registry contract: every family a foreign layout imports into either gets its config from each of its
importers or reads it off the weights. A family that does neither fails in one line that names it."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import timm
import torch
import torchvision
from safetensors.torch import save_file

import vitkit
from test_family_import import SMALL as SMALL_SWIN
from test_load_whole import MaskedAutoencoderViT, _hf_mae, _open_clip_pair, dino_checkpoint
from vitkit.api import read_checkpoint
from vitkit.cli.main import main
from vitkit.errors import CheckpointError
from vitkit.models import FAMILIES, get_entry, get_family
from vitkit.weights.convert import LAYOUTS, detect_layout, unwrap
from vitkit.weights.layouts import Imported, layout

API = Path(vitkit.__file__).parent / "api.py"


# ---------------------------------------------------------------------------- the registry contract
def _swin(tmp_path):
    with torch.device("meta"):  # shapes are all an importer reads
        return timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **SMALL_SWIN).state_dict()


def _mae(tmp_path):
    return {"model": MaskedAutoencoderViT().state_dict()}


def _hf_mae_folder(tmp_path):
    _hf_mae(norm_pix=True).save_pretrained(tmp_path / "mae", safe_serialization=True)
    return tmp_path / "mae"


def _clip_pair(tmp_path):
    return _open_clip_pair(tmp_path)[1]


def _dino(tmp_path):
    dino_checkpoint(tmp_path / "checkpoint.pth")
    return tmp_path / "checkpoint.pth"


def _torchvision_mobilenet(tmp_path):
    import torchvision

    return torchvision.models.mobilenet_v3_small(num_classes=5).state_dict()


def _timm_mobilevit(tmp_path):
    with torch.device("meta"):
        return timm.create_model("mobilevit_xxs", num_classes=5).state_dict()


def _hf_mobilevit(tmp_path):
    from test_mobilevit import _hf_v2

    return _hf_v2()[1].state_dict()


# a real foreign checkpoint of each layout whose family reads no config off weights (a state dict or a path);
# a new layout of such a family needs one here, or its family an infer_config
FOREIGN_SAMPLES = {"swin": _swin, "mae": _mae, "hf-vitmae-pretraining": _hf_mae_folder, "openai-clip": _clip_pair,
                   "dino": _dino, "torchvision-mobilenet-v3": _torchvision_mobilenet, "timm-mobilevit": _timm_mobilevit,
                   "hf-mobilevit": _hf_mobilevit}


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda lay: lay.name)
def test_every_imported_family_gets_its_config_from_the_importer_or_the_weights(lay, tmp_path):
    fam = get_family(lay.family)
    if fam.infer_config is not None:
        return  # checked by the round trip below
    assert lay.name in FOREIGN_SAMPLES, \
        f"layout {lay.name} imports into {fam.name}, which has no infer_config: add a sample to FOREIGN_SAMPLES"
    sample = FOREIGN_SAMPLES[lay.name](tmp_path)
    if isinstance(sample, dict):
        assert detect_layout(unwrap(sample)).name == lay.name  # the sample is this layout's, not another's
    ckpt = read_checkpoint(sample if isinstance(sample, dict) else str(sample))
    assert ckpt.family == fam.name
    assert isinstance(ckpt.config, fam.config), f"{lay.name}'s importer gives no {fam.name} config"


def test_every_sample_is_a_registered_layout():
    """The table above only names layouts that exist (a renamed layout would make its check vanish)."""
    assert set(FOREIGN_SAMPLES) <= {lay.name for lay in LAYOUTS}


# registered names of several ViT kinds (distilled, LayerScale, registers-free DINOv2, CLIP's pre-norm)
ROUND_TRIP = ["vit_tiny_patch16_224", "deit_tiny_distilled_patch16_224", "deit3_small_patch16_224",
              "vit_small_patch14_dinov2", "vit_base_patch16_clip_224"]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_reader_gives_back_its_registered_architectures(name):
    """infer_config resolves to its reader, and the weights of registered models (their shapes: meta tensors)
    read back as configs of the same architecture, with the same short shape."""
    family = get_family(name)
    if family.infer_config is None:
        return  # its importers give the config (the test above)
    names = [n for n in ROUND_TRIP if get_entry(n).family == family.name]
    assert names, f"name some registered {family.name} models in ROUND_TRIP"
    for model_name in names:
        entry = get_entry(model_name)
        with torch.device("meta"):
            sd = entry.build().state_dict()
        stated = {f: getattr(entry.cfg, f) for f in family.unrecorded_fields}  # what a file does not record
        cfg = family.read_config(sd, stated, source=model_name)
        assert isinstance(cfg, family.config)
        if family.shape_key is not None:
            assert family.shape_key(cfg) == family.shape_key(entry.cfg), model_name
        if family.describe_shape is not None:
            assert family.describe_shape(cfg) == family.describe_shape(entry.cfg), model_name


def test_the_vit_shape_key_tells_architectures_apart():
    """One block more, LayerScale or not: another architecture; LayerScale's init value or the head: the same."""
    vit = get_family("vit")
    cfg = get_entry("deit3_small_patch16_224").cfg
    assert vit.shape_key(cfg.replace(depth=cfg.depth + 1)) != vit.shape_key(cfg)
    assert vit.shape_key(cfg.replace(init_values=None)) != vit.shape_key(cfg)
    assert vit.shape_key(cfg.replace(init_values=0.1, num_classes=3)) == vit.shape_key(cfg)


# ---------------------------------------------------------------------------- a family that cannot read weights
@pytest.fixture
def bare_resnet_layout():
    """torchvision ResNet files as a layout whose importer gives no config, into a family (resnet) that reads
    none off the weights: registered through the real registry for this test only."""
    assert getattr(get_family("resnet"), "infer_config", None) is None

    @layout("test-torchvision-resnet", lambda sd: "layer1.0.conv1.weight" in sd and "fc.weight" in sd,
            priority=100, family="resnet")
    def convert(sd, hf_config=None):
        return Imported(dict(sd), "test-torchvision-resnet", family="resnet")

    yield
    LAYOUTS[:] = [lay for lay in LAYOUTS if lay.name != "test-torchvision-resnet"]


@pytest.fixture
def torchvision_resnet_file(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "resnet18_torchvision.safetensors"
    save_file(torchvision.models.resnet18(num_classes=5).state_dict(), str(path))
    return path


def test_a_family_without_inference_fails_in_one_line_naming_it(bare_resnet_layout, torchvision_resnet_file,
                                                                 tmp_path, capsys):
    with pytest.raises(CheckpointError) as e:
        vitkit.load_model(torchvision_resnet_file)
    message = str(e.value)
    assert "\n" not in message and "resnet" in message and str(torchvision_resnet_file) in message
    assert "model_name=NAME" in message
    # what it says to do works: the architecture named (torchvision's 7x7 stem), the same file loads
    model = vitkit.load_model(torchvision_resnet_file, model_name="resnet18", small_stem=False)
    assert model.family == "resnet" and model.num_classes == 5
    # the command line: one stderr line, no traceback
    assert main(["convert", str(torchvision_resnet_file), str(tmp_path / "out.safetensors")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "resnet" in err and "Traceback" not in err, err


def test_weights_that_do_not_form_the_family_name_it():
    """A state dict that the vit reader cannot make a ViT of (a 2-D patch filter) is one line naming vit."""
    with torch.device("meta"):
        sd = get_entry("vit_tiny_patch16_224").build().state_dict()
    sd["patch_embed.proj.weight"] = torch.zeros(192, 3 * 16 * 16)  # a linear patch embedding: not a ViT's conv
    sd["blocks.0.mlp.fc1.weight"] = torch.zeros(2, 2, 2)
    with pytest.raises(CheckpointError, match="vit") as e:
        get_family("vit").read_config(sd, {}, source="odd.safetensors")
    assert "\n" not in str(e.value) and "odd.safetensors" in str(e.value)


# ---------------------------------------------------------------------------- api.py names no family
def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def test_api_names_no_family_and_no_field_only_one_family_has():
    """What is one family's is its entry's: api.py holds no family's name nor a config field that only one
    family's config has, except the fields a load adapts (`_ADAPTED`: regularisation and initialisation,
    which a recipe changes without making another architecture)."""
    from vitkit.api import _ADAPTED

    fields = {name: {f.name for f in dataclasses.fields(fam.config)} for name, fam in FAMILIES.items()}
    only_one = {f for name, own in fields.items()
                for f in own - set().union(*(o for n, o in fields.items() if n != name))}
    only_one -= {"arch"}  # ResNetConfig.arch, and the provenance key every model has (the registered name)
    named = _string_constants(API) & (set(FAMILIES) | (only_one - _ADAPTED))
    assert not named, f"api.py names {sorted(named)}: make it a Family entry field"
