"""`vitkit search --text` on a locally built random-weight CLIP pair: the hits are the images whose
`encode_image` embeddings are most similar to the text's, by brute force."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli.main import main as cli
from vitkit.data.images import load_image
from vitkit.data.transforms import eval_transform


def test_text_search_ranks_by_clip_similarity(tmp_path, capsys):
    from skimage import data

    from vitkit.zeroshot import text_features

    photos = tmp_path / "photos"
    photos.mkdir()
    names = ["astronaut", "coffee", "chelsea", "rocket"]
    for name in names:
        Image.fromarray(getattr(data, name)()).save(photos / f"{name}.png")
    torch.manual_seed(0)
    model = vitkit.create_model("clip_vit_tiny_test").eval()
    vitkit.save_model(model, tmp_path / "clip.safetensors")
    assert cli(["embed", str(tmp_path / "clip.safetensors"), str(photos), "--out", str(tmp_path / "emb"),
                "--quiet"]) == 0
    assert cli(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx")]) == 0
    capsys.readouterr()
    texts = ["a photo of an astronaut", "a cup of coffee"]
    assert cli(["search", str(tmp_path / "idx"), *[a for t in texts for a in ("--text", t)], "-k", "4",
                "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    files = sorted(photos.glob("*.png"))
    x = torch.stack([eval_transform(model.preprocess)(load_image(p)) for p in files])
    with torch.no_grad():
        img = torch.nn.functional.normalize(model.encode_image(x), dim=1)  # [4, E]
        sims = (text_features(model, texts) @ img.T).numpy()  # [2, 4]
    for r, row in zip(res["results"], sims):
        assert r["kind"] == "text"
        order = np.argsort(-row, kind="stable")
        assert [h["path"] for h in r["hits"]] == [str(files[i]) for i in order]
        assert [h["score"] for h in r["hits"]] == pytest.approx(row[order].tolist(), abs=1e-5)
