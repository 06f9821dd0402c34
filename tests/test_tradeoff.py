"""`vitkit tradeoff`: one checkpoint scored, costed and timed at each setting of resolution, patch size and token
merging; the Pareto front; a budget's pick; the pick saved as the checkpoint's default inference settings."""
from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import vitkit
from vitkit import tradeoff as t
from vitkit.analysis.cost import model_cost
from vitkit.cli.main import main as cli
from vitkit.errors import ConfigError
from vitkit.training.recipes import get_recipe
from vitkit.training.trainer import Trainer


@pytest.fixture(scope="module")
def digits_ckpt(tmp_path_factory):
    """The digits preset's ViT (8 px, patch 2: 16 patches, sin-cos positions, average pooling), 4 epochs: enough
    for the settings to differ in accuracy, which is all these tests need of it."""
    out = tmp_path_factory.mktemp("tradeoff") / "run"
    recipe = get_recipe("digits").replace(epochs=4, ema=False, val_fraction=0.0)
    Trainer(recipe, out, quiet=True).run()
    return out / "last.safetensors"


def test_the_default_grid_turns_one_knob_at_a_time_and_every_setting_is_valid(digits_ckpt):
    model = vitkit.load_model(digits_ckpt)
    grid = t.default_grid(model)
    n = t.native(model)
    assert grid[0] == n == t.Setting(8, 2, 0)
    for s in grid[1:]:
        changed = [s.img_size != n.img_size, s.patch_size != n.patch_size, s.merge != n.merge,
                   s.max_tokens != n.max_tokens]
        assert any(changed) and s.img_size % s.patch_size == 0
        if s.max_tokens:
            assert changed == [False, False, False, True]
        if s.merge:
            assert s.merge <= (s.img_size // s.patch_size) ** 2 // 2
    assert {s.patch_size for s in grid} == {2, 3, 4} and sorted({s.merge for s in grid}) == [0, 1, 2, 3]
    assert sorted({s.max_tokens for s in grid}) == [0, 8, 16]  # NaFlex: the native 16 patches, and half


def test_a_grid_is_the_product_of_its_axes_and_says_what_it_skips(digits_ckpt):
    model = vitkit.load_model(digits_ckpt)
    grid, skipped = t.grid_from_axes(model, t.parse_grid("img=8,12;patch=2,4;merge=0,3"))
    assert t.Setting(12, 4, 0) in grid and t.Setting(8, 2, 3) in grid
    assert t.Setting(12, 4, 3) in grid and t.Setting(8, 4, 3) not in grid  # 4 patches: at most 2 per block
    assert any(line.startswith("8px p4 r3: merge=3") for line in skipped)
    for bad in ("img", "size=8", "img=a,b", "patch=-2"):
        with pytest.raises(ConfigError, match="AXIS=N"):
            t.parse_grid(bad)
    with pytest.raises(ConfigError, match="no setting"):
        t.grid_from_axes(model, t.parse_grid("img=9;patch=2"))


def test_each_row_equals_the_model_loaded_at_that_setting(digits_ckpt):
    """Top-1 at the native setting equals `vitkit eval`'s; each row's GMACs and tokens are the closed form of
    the checkpoint loaded at that setting; merging leaves fewer tokens out of the last block."""
    from vitkit.data.datasets import load_eval_split

    model = vitkit.load_model(digits_ckpt)
    _, _, ds = load_eval_split("digits", channels=1, class_names=model.class_names)
    settings = [t.Setting(8, 2, 0), t.Setting(8, 4, 0), t.Setting(8, 2, 3), t.Setting(12, 2, 0)]
    rows = t.measure(digits_ckpt, settings, ds, model.num_classes, batch=4, repeats=2)
    for row, s in zip(rows, settings):
        loaded = vitkit.load_model(digits_ckpt, img_size=s.img_size, **({"patch_size": s.patch_size} if s.patch_size != 2
                                                                        else {}), **({"merge": s.merge} if s.merge else {}))
        cost = model_cost(loaded)
        assert row["gmacs"] == pytest.approx(cost.macs_total / 1e9, abs=1e-4) and row["tokens"] == cost.tokens
        assert row["latency_ms"] > 0 and row["img_per_s"] > 0 and row["count"] == len(ds)
    assert rows[2]["tokens_out"] < rows[0]["tokens_out"] == rows[0]["tokens"]
    assert rows[1]["tokens"] < rows[0]["tokens"] < rows[3]["tokens"]


def test_a_token_budget_row_is_the_model_at_that_budget_costed_at_each_images_grid(digits_ckpt):
    """digits are square 8x8: a budget of 16 patches is the native 4x4 grid (the native row's top-1 and cost); 8
    patches gives each image the largest square grid within it, 2x2 (no class token: average pooling)."""
    from vitkit.data.datasets import load_eval_split
    from vitkit.inference import evaluate_on

    model = vitkit.load_model(digits_ckpt)
    _, _, ds = load_eval_split("digits", channels=1, class_names=model.class_names)
    settings = [t.Setting(8, 2, 0), t.Setting(8, 2, 0, 16), t.Setting(8, 2, 0, 8)]
    rows = t.measure(digits_ckpt, settings, ds, model.num_classes, batch=4, repeats=2)
    assert rows[1]["top1"] == rows[0]["top1"] and rows[1]["gmacs"] == rows[0]["gmacs"]
    assert rows[1]["tokens"] == rows[0]["tokens"] == 16 and rows[2]["tokens"] == 4
    assert rows[2]["gmacs"] == pytest.approx(model_cost(model, img_size=4).macs_total / 1e9, abs=1e-4)
    assert rows[2]["top1"] == pytest.approx(evaluate_on(vitkit.load_model(digits_ckpt, max_tokens=8), "digits")["top1"],
                                            abs=0.01)
    assert rows[2]["label"] == "8px p2 <=8t"


def test_native_row_top1_equals_vitkit_eval(digits_ckpt, capsys):
    from vitkit.data.datasets import load_eval_split

    model = vitkit.load_model(digits_ckpt)
    _, _, ds = load_eval_split("digits", channels=1, class_names=model.class_names)
    (row,) = t.measure(digits_ckpt, [t.native(model)], ds, model.num_classes, batch=2, repeats=1)
    capsys.readouterr()
    assert cli(["eval", str(digits_ckpt), "--data", "digits", "--json"]) == 0
    assert row["top1"] == pytest.approx(json.loads(capsys.readouterr().out)["top1"], abs=0.01)


ROWS = [{"label": "a", "top1": 90.0, "gmacs": 1.0, "latency_ms": 10.0},
        {"label": "b", "top1": 85.0, "gmacs": 0.5, "latency_ms": 4.0},
        {"label": "c", "top1": 80.0, "gmacs": 0.6, "latency_ms": 3.0},  # beaten on GMACs by b, not on ms
        {"label": "d", "top1": 90.0, "gmacs": 1.2, "latency_ms": 12.0}]  # beaten by a on both


def test_the_pareto_front_and_the_budget_pick():
    assert [r["label"] for r in t.pareto(ROWS, "gmacs")] == ["b", "a"]
    assert [r["label"] for r in t.pareto(ROWS, "latency_ms")] == ["c", "b", "a"]
    assert t.choose(ROWS, budget_gmacs=0.9)["label"] == "b"
    assert t.choose(ROWS, budget_ms=3.5)["label"] == "c"
    assert t.choose(ROWS, budget_gmacs=5)["label"] == "a"  # ties on top-1: the cheaper
    with pytest.raises(ConfigError, match="no setting fits 0.1 GMACs: the cheapest measured is b"):
        t.choose(ROWS, budget_gmacs=0.1)
    with pytest.raises(ConfigError, match="one budget"):
        t.choose(ROWS)


def test_cli_table_plot_json_and_a_saved_choice_that_loads_at_its_setting(digits_ckpt, tmp_path, capsys):
    out, plot, saved = tmp_path / "r.json", tmp_path / "curve.png", tmp_path / "chosen.safetensors"
    assert cli(["tradeoff", str(digits_ckpt), "--grid", "img=8;patch=2,4;merge=0,3", "--repeats", "2",
                "--budget-gmacs", "1000", "--save", str(saved), "--plot", str(plot), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads(out.read_text())
    assert Image.open(plot).size[0] > 500
    assert [r["label"] for r in report["rows"]] == ["8px p2", "8px p2 r3", "8px p4"]  # p4: 4 patches, r <= 2
    best = max(report["rows"], key=lambda r: (r["top1"], -r["gmacs"]))
    assert report["chosen"] == best
    model = vitkit.load_model(saved)  # runs at the chosen setting by default
    assert (model.cfg.patch_size, model.cfg.merge) == (best["patch_size"], best["merge"])
    stored = model.provenance["inference_settings"]
    assert stored["measured"]["top1"] == best["top1"] and stored["budget"] == {"gmacs": 1000.0}
    # the file keeps the original weights: at the native setting it is the checkpoint itself
    a, b = load_file(str(digits_ckpt)), load_file(str(saved))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    again = vitkit.load_model(saved, patch_size=2, merge=0).eval()  # eval: the preset trains with drop-path
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(again(x), vitkit.load_model(digits_ckpt).eval()(x))
    capsys.readouterr()
    assert cli(["eval", str(saved), "--json"]) == 0  # eval runs it at the stored setting: the chosen row's top-1
    assert json.loads(capsys.readouterr().out)["top1"] == pytest.approx(best["top1"], abs=0.01)


def test_cli_refusals_are_one_line(digits_ckpt, capsys):
    assert cli(["tradeoff", str(digits_ckpt), "--save", "x.safetensors"]) == 2
    assert "--budget-gmacs" in capsys.readouterr().err
    assert cli(["tradeoff", str(digits_ckpt), "--grid", "img=8;patch=2", "--budget-ms", "0", "--repeats", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no setting fits 0 ms" in err[0]


def test_merge_on_the_commands_equals_loading_with_merge(digits_ckpt, tmp_path, capsys):
    from sklearn.datasets import load_digits

    from vitkit.inference import evaluate_on, predict_files

    img = tmp_path / "digit.png"
    Image.fromarray((load_digits().images[5] * 16).astype("uint8"), "L").save(img)
    merged = vitkit.load_model(digits_ckpt, merge=3)
    capsys.readouterr()
    assert cli(["predict", str(digits_ckpt), str(img), "--merge", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    want, _ = predict_files(merged, [img])
    top = got["predictions"][0]["top"]
    assert [e["index"] for e in top] == [e["index"] for e in want[0]["top"]]
    assert [e["prob"] for e in top] == pytest.approx([e["prob"] for e in want[0]["top"]], abs=1e-6)
    assert cli(["eval", str(digits_ckpt), "--data", "digits", "--merge", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["top1"] == pytest.approx(evaluate_on(merged, "digits")["top1"])
    assert cli(["predict", str(digits_ckpt), str(img), "--merge", "9"]) == 2  # 16 patches: at most 8
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "merge=9" in err[0]
    cnn = tmp_path / "cnn.safetensors"
    vitkit.save_model(vitkit.create_model("resnet18", in_chans=1, num_classes=10), cnn)
    assert cli(["predict", str(cnn), str(img), "--merge", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot merge tokens" in err[0]
    with pytest.raises(SystemExit):
        cli(["predict", str(digits_ckpt), str(img), "--merge", "-1"])
