"""Several index folders searched as one collection (retrieval/sharded.py): the digits embedded by the bundled
model in two parts (its train and test splits), one flat index per part, against one flat index over
all of them; then the CLI over parts of a folder of real photos, and what is refused."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from vitkit.cli.main import main as cli
from vitkit.errors import ConfigError
from vitkit.retrieval import Embeddings, SearchIndex, build_index, embed
from vitkit.retrieval.sharded import ShardedIndex, index_folders

BUNDLED = "bundled:fashion-mnist"


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """(the folder holding idx-train, idx-test and idx-all, the embeddings of all digits)."""
    base = tmp_path_factory.mktemp("sharded")
    model = vitkit.load_model(BUNDLED).eval()
    for split in ("train", "test", "all"):
        embed(model, "digits", base / f"emb-{split}", checkpoint=BUNDLED, split=split, chunk_size=512, batch_size=256)
        build_index(base / f"emb-{split}", base / f"idx-{split}", kind="flat")
    return base, Embeddings(base / "emb-all")


def test_parts_searched_together_equal_one_index_over_the_union(parts):
    base, everything = parts
    whole = SearchIndex.load(base / "idx-all")
    sharded = ShardedIndex.load(f"{base}/idx-train,{base}/idx-test")
    assert len(sharded) == len(whole) == len(everything) == 1797 and len(sharded.parts) == 2
    q = np.asarray(everything.vectors[::37], dtype=np.float32)  # [49, D]: queries from every split
    for merged, single in zip(sharded.search(q, k=10), whole.search(q, k=10)):
        assert [h.path for h in merged] == [h.path for h in single]
        np.testing.assert_allclose([h.score for h in merged], [h.score for h in single], atol=1e-6)
        assert all(h.index.endswith(("idx-train", "idx-test")) for h in merged)
        assert {h.index for h in merged} <= {str(p.path) for p in sharded.parts}
        # the id of a hit is its row in its own part
        for h in merged:
            part = next(p for p in sharded.parts if str(p.path) == h.index)
            assert part.row_by_id[h.row]["path"] == h.path
    # a glob names the same parts (sorted), without the union's folder when the pattern leaves it out
    assert [p.name for p in index_folders(f"{base}/idx-t*")] == ["idx-test", "idx-train"]


def test_more_hits_asked_than_a_part_holds(parts):
    base, everything = parts
    small = ShardedIndex.load([base / "idx-train", base / "idx-test"])
    k = len(small) + 5  # more than both parts together: every vector once, no -1 padding as hits
    hits = small.search(np.asarray(everything.vectors[:2], dtype=np.float32), k=k)
    assert [len(h) for h in hits] == [len(small)] * 2
    assert all(a.score >= b.score for h in hits for a, b in zip(h, h[1:]))


def test_cli_searches_parts_and_refuses_what_does_not_belong(parts, tmp_path, capsys):
    from skimage import data

    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8", img_size=16, depth=1, num_classes=0).eval()
    vitkit.save_model(model, tmp_path / "m.safetensors")
    names = ["astronaut", "coffee", "chelsea", "rocket", "camera", "cat"]
    for i, name in enumerate(names):
        folder = tmp_path / ("day1" if i < 3 else "day2") / "ab"[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(getattr(data, name)()).resize((48, 40)).save(folder / f"{name}.png")
    for day in ("day1", "day2"):
        assert cli(["embed", str(tmp_path / "m.safetensors"), str(tmp_path / day), "--out", str(tmp_path / f"e-{day}"),
                    "--quiet", "--workers", "0"]) == 0
        assert cli(["index", str(tmp_path / f"e-{day}"), "--out", str(tmp_path / f"i-{day}")]) == 0
    query = tmp_path / "day2" / "b" / "rocket.png"
    capsys.readouterr()
    assert cli(["search", f"{tmp_path}/i-*", str(query), "-k", "4", "--json", "--sheet", str(tmp_path / "s.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    hits = out["results"][0]["hits"]
    assert len(out["parts"]) == 2 and len(hits) == 4 and hits[0]["path"] == str(query)
    assert hits[0]["index"] == str(tmp_path / "i-day2") and {h["index"] for h in hits} == set(out["parts"])
    assert Image.open(tmp_path / "s.png").width > 4 * 112
    assert cli(["search", f"{tmp_path}/i-day1,{tmp_path}/i-day2", str(query)]) == 0
    assert "i-day1" in capsys.readouterr().out  # the table names each hit's part
    # an index of another model among the parts; a pattern matching nothing; --eval over parts
    base, _ = parts
    assert cli(["search", f"{tmp_path}/i-day1,{base}/idx-test", str(query)]) == 2
    assert "idx-test holds 128-d vectors" in capsys.readouterr().err
    assert cli(["search", f"{tmp_path}/nothing-*", str(query)]) == 2
    assert "matches no index folder" in capsys.readouterr().err
    assert cli(["search", f"{tmp_path}/i-*", "--eval", "self"]) == 2
    assert "give one index folder" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="another model"):
        other = vitkit.create_model("vit_pico_patch2_8", img_size=16, depth=1, num_classes=0)
        vitkit.save_model(other, tmp_path / "o.safetensors")
        assert cli(["embed", str(tmp_path / "o.safetensors"), str(tmp_path / "day1"), "--out",
                    str(tmp_path / "e-other"), "--quiet", "--workers", "0"]) == 0
        assert cli(["index", str(tmp_path / "e-other"), "--out", str(tmp_path / "i-other")]) == 0
        ShardedIndex.load([tmp_path / "i-day1", tmp_path / "i-other"])
