"""`vitkit models` and `vitkit cost`, run in-process."""
import json

import pytest
import torch

import vitkit
from vitkit.analysis.cost import model_cost
from vitkit.cli.main import main
from vitkit.models import get_entry


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_models_json_agrees_with_api(capsys):
    rc, out, err = run_cli(capsys, "models", "--json")
    assert rc == 0 and err == ""
    rows = {r["name"]: r for r in json.loads(out)}
    assert sorted(rows) == vitkit.list_models()
    b16 = rows["vit_base_patch16_224"]
    assert b16["params"] == model_cost("vit_base_patch16_224").params_total == 86_567_656
    assert b16["gmacs"] == round(model_cost("vit_base_patch16_224").gmacs_per_image, 2)
    assert (b16["patch_size"], b16["embed_dim"], b16["depth"], b16["num_heads"]) == (16, 768, 12, 12)
    assert "augreg_in21k_ft_in1k" in b16["pretrained"] and b16["pretrained"] == sorted(get_entry(
        "vit_base_patch16_224").pretrained)  # all of timm's tags
    assert rows["vit_large_patch14_dinov2"]["img_size"] == [518, 518]
    assert {r["family"] for r in rows.values()} == set(vitkit.models.FAMILIES) >= {"vit", "resnet", "swin"}
    assert {r["group"] for r in rows.values()} >= {"vit", "deit", "deit3", "dinov2", "clip", "mae", "cnn-baseline"}
    with torch.device("meta"):
        rn = sum(p.numel() for p in vitkit.create_model("resnet18").parameters())
    assert rows["resnet18"]["params"] == rn and rows["resnet18"]["gmacs"] is None


def test_models_pattern_and_table(capsys):
    rc, out, _ = run_cli(capsys, "models", "deit_*_distilled*", "--json")
    assert rc == 0
    assert [r["name"] for r in json.loads(out)] == vitkit.list_models("deit_*_distilled*")
    rc, out, _ = run_cli(capsys, "models", "dinov2")
    assert rc == 0 and "vit_small_patch14_reg4_dinov2" in out and "384/12/6" in out


def test_cost_json_and_table(capsys):
    rc, out, err = run_cli(capsys, "cost", "vit_base_patch16_224", "--json")
    assert rc == 0 and err == ""
    assert json.loads(out) == json.loads(json.dumps(model_cost("vit_base_patch16_224").to_dict()))
    rc, out, _ = run_cli(capsys, "cost", "vit_base_patch16_224")
    assert rc == 0
    for text in ("86,567,656", "590,592", "38,809", "197 (1 + 196)", "17.56"):
        assert text in out


def test_cost_options_and_variant(capsys):
    rc, out, _ = run_cli(capsys, "cost", "B/16", "--img-size", "384x224", "--batch", "4", "--dtype", "bf16",
                         "--eager-attn", "--json")
    assert rc == 0
    d = json.loads(out)
    ref = model_cost("B/16", img_size=(384, 224), batch=4, dtype="bf16", fused_attention=False)
    assert d["grid"] == [24, 14] and d["batch"] == 4 and d["dtype"] == "bf16"
    assert d["activation_bytes"] == ref.activation_bytes and d["macs_total"] == ref.macs_total


def test_cost_of_checkpoint_files(capsys, tmp_path):
    model = vitkit.create_model("vit_tiny_patch4_28")
    path = vitkit.save_model(model, tmp_path / "tiny.safetensors")
    rc, out, _ = run_cli(capsys, "cost", str(path), "--json")
    assert rc == 0 and json.loads(out)["params_total"] == sum(p.numel() for p in model.parameters())
    # a foreign (timm-layout) file: the architecture is read off the weights
    import timm
    from safetensors.torch import save_file

    peer = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, depth=2,
                             num_classes=7)
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(tmp_path / "timm.safetensors"))
    rc, out, _ = run_cli(capsys, "cost", str(tmp_path / "timm.safetensors"), "--json")
    d = json.loads(out)
    assert rc == 0 and d["params_total"] == sum(p.numel() for p in peer.parameters()) and d["tokens"] == 65


@pytest.mark.parametrize("argv", [
    ["cost", "vit_nonexistent_patch16_224"],
    ["cost", "vit_base_patch16_224", "--img-size", "225"],
    ["cost", "no/such/model.safetensors"],
    ["models", "zzz_no_match"],
])
def test_bad_model_or_size_is_one_line_exit_2(capsys, argv):
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "error" in err


@pytest.mark.parametrize("argv", [
    ["cost", "vit_base_patch16_224", "--batch", "0"],
    ["cost", "vit_base_patch16_224", "--img-size", "2x2x2"],
    ["cost", "vit_base_patch16_224", "--dtype", "int8"],
])
def test_bad_argument_is_one_line_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
