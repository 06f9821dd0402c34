"""Zero-shot classification: the prompt-ensembled classifier against a direct computation and open_clip's
`build_zero_shot_classifier`, and `vitkit zeroshot` / `vitkit eval --zeroshot` on real images (scikit-image
photos, the digits) with random-weight CLIP pairs: an open_clip file and a vitkit file."""
from __future__ import annotations

import json
import sys

import open_clip
import pytest
import torch
import torch.nn.functional as F
from open_clip.zero_shot_classifier import build_zero_shot_classifier
from PIL import Image
from safetensors.torch import save_file
from skimage import data as skdata

import vitkit
from vitkit.cli.main import main
from vitkit.data.datasets import load_data
from vitkit.data.images import load_image
from vitkit.data.transforms import eval_transform
from vitkit.errors import ConfigError
from vitkit.text import tokenize
from vitkit.zeroshot import build_classifier, load_clip, load_templates, text_features, zeroshot_predict

LABELS = ["cat", "astronaut", "cup of coffee", "rocket"]
TEMPLATES = ["a photo of a {}.", "a blurry photo of the {}.", "art of the {}."]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(folder, open_clip peer, its file): a random open_clip pair with 64-wide heads (what a foreign file is
    assumed to have), QuickGELU, every parameter perturbed; and four scikit-image photos as PNG files."""
    d = tmp_path_factory.mktemp("zeroshot")
    torch.manual_seed(0)
    peer = open_clip.CLIP(32, open_clip.CLIPVisionCfg(layers=1, width=128, head_width=64, patch_size=8, image_size=32),
                          open_clip.CLIPTextCfg(width=128, heads=2, layers=1), quick_gelu=True).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in peer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    path = d / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(path))
    for name in ("chelsea", "astronaut", "coffee", "rocket"):
        Image.fromarray(getattr(skdata, name)()).save(d / f"{name}.png")
    return d, peer, path


def run_cli(argv, capsys) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_classifier_is_the_prompt_ensemble(pair):
    _, peer, path = pair
    model = load_clip(path).eval()
    W = build_classifier(model, LABELS, TEMPLATES)  # [C, E]
    # direct: each prompt's normalised embedding, mean over the templates of a class, normalised again
    rows = []
    for label in LABELS:
        emb = F.normalize(model.encode_text(tokenize([t.replace("{}", label) for t in TEMPLATES])), dim=-1)
        rows.append(F.normalize(emb.mean(0), dim=0))
    direct = torch.stack(rows).detach()
    assert W.shape == (4, 32) and torch.allclose(W, direct, atol=1e-6)
    assert torch.allclose(W.norm(dim=1), torch.ones(4), atol=1e-6)
    # the mean of normalised embeddings differs from the embedding of any single template
    assert (W - text_features(model, [TEMPLATES[0].replace("{}", x) for x in LABELS])).abs().max() > 1e-3
    ref = build_zero_shot_classifier(peer, open_clip.tokenize, LABELS, TEMPLATES, num_classes_per_batch=None)
    assert (W - ref.t()).abs().max() <= 1e-5


def test_zeroshot_cli_on_photos(pair, capsys, tmp_path):
    d, peer, path = pair
    photos = [d / f"{n}.png" for n in ("chelsea", "astronaut", "coffee", "rocket")]
    rc, out, err = run_cli(["zeroshot", path, *photos, "--labels", ",".join(LABELS), "--templates", "simple",
                            "--top-k", "4", "--json", "--save", tmp_path / "zs.safetensors"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert res["labels"] == LABELS and res["num_templates"] == 1 and not res["errors"]
    # the same probabilities computed here: CLIP's preprocessing, softmax(exp(logit_scale) * cos) with the peer
    model = load_clip(path).eval()
    tf = eval_transform(model.preprocess)
    x = torch.stack([tf(load_image(p, 3)) for p in photos])
    W = build_zero_shot_classifier(peer, open_clip.tokenize, LABELS, ["a photo of a {}."], num_classes_per_batch=None)
    with torch.no_grad():
        expected = (peer.logit_scale.exp() * peer.encode_image(x, normalize=True) @ W).softmax(-1)  # [4, C]
    assert torch.allclose(zeroshot_predict(model, x, build_classifier(model, LABELS, "simple")), expected, atol=1e-5)
    for pred, probs in zip(res["predictions"], expected):
        got = {t["label"]: t["prob"] for t in pred["top"]}
        assert set(got) == set(LABELS)
        assert all(abs(got[name] - float(p)) <= 1e-5 for name, p in zip(LABELS, probs))
        assert [t["prob"] for t in pred["top"]] == sorted(got.values(), reverse=True)
    # the saved pair carries the classifier as its head: `vitkit predict` gives the same answer
    rc, out, err = run_cli(["predict", tmp_path / "zs.safetensors", photos[0], "--top-k", "4", "--json"], capsys)
    assert rc == 0, err
    again = {t["label"]: t["prob"] for t in json.loads(out)["predictions"][0]["top"]}
    assert all(abs(again[name] - float(p)) <= 1e-5 for name, p in zip(LABELS, expected[0]))
    # the table, with the default imagenet templates
    rc, out, err = run_cli(["zeroshot", path, photos[1], "--labels", "cat,dog"], capsys)
    flat = "".join(out.split())  # the table folds long cells
    assert rc == 0 and "80template(s)perclass" in flat and "cat" in flat and "dog" in flat and "%" in flat, err


def test_eval_zeroshot_on_digits(capsys, tmp_path):
    """A vitkit file of the registered tiny pair on the digits test split: the accuracy and confusion matrix are
    those of the zero-shot classifier of the prompts given for the classes 0..9."""
    torch.manual_seed(0)
    ckpt = vitkit.save_model(vitkit.create_model("clip_vit_tiny_test"), tmp_path / "tiny_pair.safetensors")
    words = "zero,one,two,three,four,five,six,seven,eight,nine"
    rc, out, err = run_cli(["eval", ckpt, "--zeroshot", "--data", "digits", "--labels", words, "--templates",
                            "simple", "--json"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    model = load_clip(ckpt).eval()
    bundle = load_data("digits")
    assert res["zeroshot"]["prompts"] == words.split(",") and res["count"] == len(bundle.test)
    tf = eval_transform(model.preprocess)
    x = torch.stack([tf(img) for img, _ in bundle.test])
    y = torch.tensor([label for _, label in bundle.test])
    pred = zeroshot_predict(model, x, build_classifier(model, words.split(","), "simple")).argmax(-1)
    assert res["top1"] == pytest.approx(100.0 * (pred == y).float().mean().item())
    confusion = torch.zeros(10, 10, dtype=torch.long).index_put_((y, pred), torch.ones_like(y), accumulate=True)
    assert res["confusion"] == confusion.tolist()


def test_bad_input_is_one_line(pair, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # the table folds a long path (a deep tmp folder) across lines
    d, _, path = pair
    photo = d / "coffee.png"
    bad = tmp_path / "templates.txt"
    bad.write_text("# my prompts\na photo of {}\nno placeholder here\n")
    vit = vitkit.save_model(vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32, num_classes=2),
                            tmp_path / "vit.safetensors")
    cases = [
        (["zeroshot", path, photo, "--labels", " , ,"], "no class labels"),
        (["zeroshot", path, photo, "--labels", "cat,dog,cat"], "given twice: cat"),
        (["zeroshot", path, photo, "--labels", "cat", "--templates", bad], "exactly one {}"),
        (["zeroshot", path, photo, "--labels", "cat", "--templates", tmp_path / "none.txt"], "not imagenet, simple"),
        (["zeroshot", vit, photo, "--labels", "cat,dog"], "not a CLIP pair"),
        (["zeroshot", tmp_path / "missing.safetensors", photo, "--labels", "cat"], "no such file"),
        (["eval", path, "--zeroshot"], "needs --data"),
        (["eval", path, "--zeroshot", "--data", "digits", "--labels", "a,b"], "one per class"),
    ]
    for argv, message in cases:
        rc, out, err = run_cli(argv, capsys)
        assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    rc, out, err = run_cli(["zeroshot", path, photo, tmp_path / "missing.png", "--labels", "cat,dog"], capsys)
    assert rc == 2 and "coffee.png" in out and "missing.png" in err  # the readable image is still classified
    assert len(load_templates("imagenet")) == 80 and load_templates("simple") == ["a photo of a {}."]
    with pytest.raises(ConfigError, match="zero-shot needs a CLIP pair"):
        text_features(vitkit.load_model(vit), ["a cat"])


def test_without_the_clip_extra_the_error_names_it(pair, capsys, monkeypatch):
    """ftfy made absent the way Python reports a missing package (None in sys.modules: import raises ImportError)."""
    from vitkit.text import default_tokenizer

    d, _, path = pair
    default_tokenizer.cache_clear()  # a tokenizer built earlier in this process holds ftfy already
    monkeypatch.setitem(sys.modules, "ftfy", None)
    try:
        rc, out, err = run_cli(["zeroshot", path, d / "coffee.png", "--labels", "cat"], capsys)
    finally:
        default_tokenizer.cache_clear()
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "pip install 'vitkit[clip]'" in err and "ftfy" in err


def test_a_registered_name_reads_open_clips_file_from_the_hub_cache(pair, tmp_path, monkeypatch, capsys):
    """`clip_vit_base_patch32.openai` is open_clip's file in timm's hub repo (here a small pair placed in a local
    cache, offline, with the registered name made as small); not cached and offline: one line naming the repo and
    file."""
    from huggingface_hub import constants

    from vitkit.models import get_entry
    from vitkit.models.clip import ClipConfig, clip_vision

    d, peer, path = pair
    small = ClipConfig(embed_dim=32, vision=clip_vision(128, 1, 8, img_size=32), text_width=128, text_heads=2,
                       text_layers=1)  # the fixture's pair: a registered name builds its registered architecture
    monkeypatch.setattr(get_entry("clip_vit_base_patch32"), "cfg", small)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    rc, out, err = run_cli(["zeroshot", "clip_vit_base_patch32.openai", d / "coffee.png", "--labels", "cat"], capsys)
    assert rc == 2 and "timm/vit_base_patch32_clip_224.openai/open_clip_model.safetensors" in err
    assert "not in the cache" in err and len(err.strip().splitlines()) == 1
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo_dir = tmp_path / "models--timm--vit_base_patch32_clip_224.openai"
    (repo_dir / "snapshots" / commit).mkdir(parents=True)
    (repo_dir / "snapshots" / commit / "open_clip_model.safetensors").write_bytes(path.read_bytes())
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(commit)
    model = load_clip("clip_vit_base_patch32.openai").eval()
    assert model.provenance["source"] == "hub:timm/vit_base_patch32_clip_224.openai"
    # the snapshot folder itself, which also holds timm's image tower alone as model.safetensors
    vit = vitkit.create_model("vit_tiny_patch16_224", depth=1, img_size=32, num_classes=2)
    save_file(vit.state_dict(), str(repo_dir / "snapshots" / commit / "model.safetensors"))
    folder = load_clip(repo_dir / "snapshots" / commit).eval()
    ids = tokenize(["a cat"])
    with torch.no_grad():
        assert (model.encode_text(ids) - peer.encode_text(ids)).abs().max() <= 1e-4
        assert torch.equal(folder.encode_text(ids), model.encode_text(ids))
