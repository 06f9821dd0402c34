"""WebDataset tar shards as `--data` and `vitkit shards`, on real tars: written by `vitkit shards` from real
digits and scikit-image photos, by webdataset's own ShardWriter, and by hand with tarfile for the broken ones.

The equalities: a split read from shards is the folder's split (pixels, labels, order), `embed` gives the same
vector per image, a training run from shards reaches the folder run's weights, and a run interrupted mid-epoch
and resumed reaches the uninterrupted run's."""
from __future__ import annotations

import io
import json
import os
import signal
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

import vitkit
from vitkit.cli.main import main as cli
from vitkit.data.datasets import claiming_source, load_data
from vitkit.data.shards import ShardImages, claims
from vitkit.errors import DataError, ImageError
from vitkit.retrieval import Embeddings, embed

QUICK = ["--epochs", "1", "--set", "steps_per_epoch=2", "--set", "batch_size=8", "--set", "threads=1",
         "--set", "eval_batch_size=64", "--quiet"]


def _digit_tree(root: Path, per_class: int = 6) -> Path:
    """The first `per_class` sklearn digits of each class as 8x8 PNGs in root/digit<y>/."""
    from sklearn.datasets import load_digits

    d = load_digits()
    seen: dict[int, int] = {}
    for i, (img, y) in enumerate(zip(d.images, d.target)):
        if seen.get(y, 0) < per_class:
            seen[y] = seen.get(y, 0) + 1
            (root / f"digit{y}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.uint8(np.round(img * 255 / 16))).save(root / f"digit{y}" / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> tuple[Path, Path]:
    """(a folder of 60 digit PNGs in 10 class folders, its shards of 16 samples written by `vitkit shards`)."""
    base = tmp_path_factory.mktemp("digits")
    folder = _digit_tree(base / "folder")
    assert cli(["shards", str(folder), "--out", str(base / "shards"), "--per-shard", "16"]) == 0
    return folder, base / "shards"


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> tuple[Path, Path]:
    """(skimage photos as JPEG and PNG of several sizes in train/ val/ test/ class folders, their shards)."""
    from skimage import data

    base = tmp_path_factory.mktemp("photos")
    names = ["astronaut", "coffee", "chelsea", "rocket", "camera", "cat", "immunohistochemistry", "hubble_deep_field"]
    for i, name in enumerate(names):
        img = Image.fromarray(getattr(data, name)())
        for split, size in (("train", (40, 32)), ("train", (24, 24)), ("val", (20, 28)), ("test", (36, 36))):
            folder = Path(base / "folder" / split / ("ab"[i % 2]))
            folder.mkdir(parents=True, exist_ok=True)
            suffix = ".jpg" if i % 3 else ".png"
            img.resize(size).save(folder / f"{name}{size[0]}{suffix}")
    assert cli(["shards", str(base / "folder"), "--out", str(base / "shards"), "--per-shard", "5"]) == 0
    return base / "folder", base / "shards"


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _png(value: int = 128) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8), value, np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def _sources(shard_dir: Path) -> dict[str, str]:
    """sample key -> the source file `vitkit shards` read it from (its .json), read back with tarfile."""
    out = {}
    for shard in sorted(shard_dir.glob("*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.name.endswith(".json"):
                    out[m.name[:-5]] = json.loads(tar.extractfile(m).read())["source"]
    return out


def _pixels(ds, i: int) -> np.ndarray:
    return np.asarray(ds[i][0])


# ---------------------------------------------------------------------------- vitkit shards
def test_vitkit_shards_writes_reproducible_shards_that_webdataset_reads(photos, tmp_path, capsys):
    folder, shards = photos
    meta = json.loads((shards / "classes.json").read_text())
    assert meta["classes"] == ["a", "b"] and meta["samples"] == {"train": 16, "val": 8, "test": 8}
    assert sorted(p.name for p in shards.glob("*.tar")) == [
        *(f"test-00000{i}.tar" for i in range(2)), *(f"train-00000{i}.tar" for i in range(4)),
        *(f"val-00000{i}.tar" for i in range(2))]
    assert not [p for p in shards.iterdir() if p.name.startswith(".")]  # atomic writes left no temp behind
    # webdataset's own reader sees the samples, keys and fields vitkit wrote, image bytes unchanged
    import webdataset as wds

    samples = list(wds.WebDataset(str(shards / "val-{000000..000001}.tar"), shardshuffle=False))
    sources = _sources(shards)
    assert [s["__key__"] for s in samples] == [f"val/{i:06d}" for i in range(8)]
    for s in samples:
        image_field = next(f for f in ("png", "jpg") if f in s)
        assert s[image_field] == (folder / sources[s["__key__"]]).read_bytes()
        assert meta["classes"][int(s["cls"])] == Path(sources[s["__key__"]]).parent.name
    # the same source gives byte-identical shards; an occupied --out needs --overwrite (one line)
    assert cli(["shards", str(folder), "--out", str(shards), "--per-shard", "5"]) == 2
    err = capsys.readouterr().err
    assert "already holds shards" in err and len(err.strip().splitlines()) == 1
    again = tmp_path / "again"
    assert cli(["shards", str(folder), "--out", str(again), "--per-shard", "5", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shards"] == {"train": 4, "val": 2, "test": 2}
    for p in shards.glob("*.tar"):
        assert (again / p.name).read_bytes() == p.read_bytes(), p.name
    # --overwrite with larger shards removes the shards the smaller ones no longer replace
    assert cli(["shards", str(folder), "--out", str(again), "--per-shard", "100", "--overwrite"]) == 0
    assert sorted(p.name for p in again.glob("*.tar")) == ["test-000000.tar", "train-000000.tar", "val-000000.tar"]


def test_vitkit_shards_refuses_what_it_cannot_convert(digits, tmp_path, capsys):
    _, shards = digits
    for args, words in ((["digits"], "converts image files"), ([str(shards)], "already shards"),
                        ([str(tmp_path / "none")], "no such dataset")):
        assert cli(["shards", *args, "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------------- reading them
def test_shards_load_as_the_folder_loads(photos):
    folder, shards = photos
    a, b = load_data(str(folder)), load_data(str(shards))
    assert b.name == str(shards) and b.class_names == a.class_names and b.info["num_skipped"] == 0
    sources = _sources(shards)
    for split in ("train", "val", "test"):
        fa, sb = getattr(a, split), getattr(b, split)
        assert isinstance(sb, ShardImages) and len(sb) == len(fa) and sb.labels.tolist() == fa.labels.tolist()
        assert sb.keys() == [f"{split}/{i:06d}" for i in range(len(fa))]  # rows keep the WebDataset keys
        assert [str(folder / sources[k]) for k in sb.keys()] == fa.keys()
        for i in range(len(fa)):
            np.testing.assert_array_equal(_pixels(sb, i), _pixels(fa, i))
    # subsets keep keys, labels and bytes; a 1-channel model's set decodes straight to gray, as files do
    part = b.train.subset([5, 1])
    assert part.keys() == ["train/000005", "train/000001"] and part.labels.tolist() == b.train.labels[[5, 1]].tolist()
    a.set_channels(1)
    b.set_channels(1)
    assert b.train[3][0].mode == "L"
    np.testing.assert_array_equal(_pixels(b.train, 3), _pixels(a.train, 3))


def test_specs_patterns_lists_and_what_is_not_claimed(digits, tmp_path):
    folder, shards = digits
    whole = load_data(str(shards)).train
    pattern = str(shards / "train-{000000..000003}.tar")
    (tmp_path / "list.shards").write_text("".join(f"{p}\n" for p in sorted(shards.glob("*.tar"))))
    (tmp_path / "list.txt").write_text("# my shards\n" + "".join(f"{os.path.relpath(p, tmp_path)}\n"
                                                               for p in sorted(shards.glob("*.tar"))))
    for spec in (pattern, str(shards / "train-*.tar"), str(tmp_path / "list.shards"), str(tmp_path / "list.txt")):
        bundle = load_data(spec)
        assert bundle.name == spec and bundle.train.keys() == whole.keys() and bundle.class_names[0] == "digit0"
    one = load_data(str(shards / "train-000001.tar")).train  # one shard, still the classes file beside it
    assert one.keys() == whole.keys()[16:32] and one.labels.tolist() == whole.labels[16:32].tolist()
    # train/ and val/ folders of shards are the splits, the classes file in the folder above them
    nested = tmp_path / "nested"
    for name, split in (("train-000000.tar", "train"), ("train-000002.tar", "train"), ("train-000001.tar", "val")):
        (nested / split).mkdir(parents=True, exist_ok=True)
        (nested / split / name.replace("train-", "")).write_bytes((shards / name).read_bytes())
    (nested / "classes.json").write_text((shards / "classes.json").read_text())
    by_folder = load_data(str(nested))
    assert by_folder.val.keys() == one.keys() and by_folder.train.keys() == whole.keys()[:16] + whole.keys()[32:48]
    assert by_folder.class_names == [f"digit{i}" for i in range(10)] and by_folder.test is None
    # a class folder, a CSV manifest (even named .txt) and the built-in names stay theirs
    (tmp_path / "labels.txt").write_text("path,label\n" + "".join(
        f"{p},{p.parent.name}\n" for p in sorted(folder.rglob("*.png"))))
    for spec in (str(folder), str(tmp_path / "labels.txt"), "digits"):
        assert not claims(spec) and claiming_source(spec) is None, spec
    assert load_data(str(tmp_path / "labels.txt")).name.startswith("csv:")


def test_webdataset_shards_with_txt_and_json_labels(tmp_path):
    """Shards another tool wrote (webdataset's ShardWriter): labels as class names in .txt, or as a named field
    of .json; split by the shard names; classes are the sorted distinct labels."""
    import webdataset as wds

    for split, n in (("train", 6), ("val", 2)):
        with wds.ShardWriter(str(tmp_path / f"{split}-%03d.tar"), maxcount=4, verbose=0) as sink:
            for i in range(n):
                sink.write({"__key__": f"{split}{i:04d}", "png": _png(30 * i), "txt": ["dog", "cat"][i % 2],
                            "json": {"species": ["dog", "cat"][i % 2], "id": i}})
    bundle = load_data(str(tmp_path))
    assert bundle.class_names == ["cat", "dog"] and bundle.info["label_key"] == "txt"
    assert bundle.train.keys() == [f"train{i:04d}" for i in range(6)] and len(bundle.val) == 2
    assert bundle.train.labels.tolist() == [1, 0, 1, 0, 1, 0] and bundle.test is None
    np.testing.assert_array_equal(_pixels(bundle.train, 2), np.full((8, 8, 3), 60, np.uint8))
    from vitkit.data import shards

    by_json = shards.load(str(tmp_path), label_key="species")
    assert by_json.train.labels.tolist() == bundle.train.labels.tolist() and by_json.info["label_key"] == "species"
    with pytest.raises(DataError, match=r"has no label: no \.breed member and no 'breed' field in its \.json"):
        shards.load(str(tmp_path), label_key="breed")


def test_images_are_read_on_access_by_byte_range(tmp_path):
    """Loading reads headers and labels only: a shard whose image bytes are not an image loads, and the bad
    sample says where it is when read; DataLoader workers read their own descriptors."""
    good = [(f"s{i:03d}.png", _png(i * 10)) for i in range(6)] + [(f"s{i:03d}.cls", b"%d" % (i % 2)) for i in range(6)]
    _tar(tmp_path / "a.tar", sorted(good) + [("zz.png", b"not a png at all"), ("zz.cls", b"1")])
    ds = load_data(str(tmp_path / "a.tar")).train
    assert len(ds) == 7 and ds.keys()[-1] == "zz" and ds.labels.tolist() == [0, 1, 0, 1, 0, 1, 1]
    with pytest.raises(ImageError, match=r"a\.tar:zz\.png: not an image file"):
        ds[6]
    from torch.utils.data import DataLoader

    from vitkit.data.datasets import Transformed
    from vitkit.data.transforms import eval_transform

    model = vitkit.create_model("vit_pico_patch2_8", depth=1)
    part = Transformed(ds.subset(range(6)), eval_transform(model.preprocess), deterministic=False)
    alone = torch.cat([x for x, _ in DataLoader(part, batch_size=2)])
    workers = torch.cat([x for x, _ in DataLoader(part, batch_size=2, num_workers=2)])
    torch.testing.assert_close(workers, alone, rtol=0, atol=0)


# ---------------------------------------------------------------------------- what uses them
def test_embed_over_shards_equals_embed_over_the_files(photos, tmp_path):
    folder, shards = photos
    torch.manual_seed(0)
    model = vitkit.create_model("vit_pico_patch2_8", img_size=16, depth=1, num_classes=0).eval()
    embed(model, str(folder), tmp_path / "files", chunk_size=7, batch_size=4)
    meta = embed(model, str(shards), tmp_path / "shards", chunk_size=7, batch_size=4)
    files, from_shards = Embeddings(tmp_path / "files"), Embeddings(tmp_path / "shards")
    assert meta["count"] == len(files) == 32 and meta["num_skipped"] == 0
    keys = [r["path"] for r in from_shards.rows]
    assert keys[:2] == ["train/000000", "train/000001"] and len(set(keys)) == 32  # rows keep the sample keys
    by_file = {r["path"]: i for i, r in enumerate(files.rows)}
    sources = _sources(shards)
    for i, row in enumerate(from_shards.rows):
        j = by_file[str(folder / sources[row["path"]])]
        np.testing.assert_array_equal(from_shards.vectors[i], files.vectors[j])
        assert row["label"] == files.rows[j]["label"] and (row["width"], row["height"]) == (
            files.rows[j]["width"], files.rows[j]["height"])


def test_search_sheet_shows_hits_read_back_from_the_shards(photos, tmp_path, capsys):
    """Hits of an index over shards are sample keys, not files: the contact sheet reads each from the shards the
    index records, so the query's own sample shows as the query does (before, an empty cell)."""
    folder, shards = photos
    torch.manual_seed(0)
    vitkit.save_model(vitkit.create_model("vit_pico_patch2_8", img_size=16, depth=1, num_classes=0),
                      tmp_path / "m.safetensors")
    assert cli(["embed", str(tmp_path / "m.safetensors"), str(shards), "--out", str(tmp_path / "emb"), "--quiet",
                "--workers", "0"]) == 0
    assert cli(["index", str(tmp_path / "emb"), "--out", str(tmp_path / "idx"), "--kind", "flat"]) == 0
    query = next((folder / "test" / "a").glob("astronaut*"))
    capsys.readouterr()
    assert cli(["search", str(tmp_path / "idx"), str(query), "-k", "3", "--sheet", str(tmp_path / "s.png"),
                "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["results"][0]["hits"]
    assert hits[0]["path"].startswith("test/") and _sources(shards)[hits[0]["path"]] == str(query.relative_to(folder))
    sheet = np.asarray(Image.open(tmp_path / "s.png").convert("RGB"))
    cell = [sheet[4:4 + 112, 4 + c * 116:4 + c * 116 + 112] for c in range(4)]  # query, then the 3 hits
    np.testing.assert_array_equal(cell[1], cell[0])  # the top hit is the query's own image
    for c in cell[2:]:
        assert (c != 255).any()  # an image, not the empty cell of an unreadable hit


def test_training_from_shards_reaches_the_folder_runs_weights(digits, tmp_path, capsys):
    folder, shards = digits
    assert cli(["train", "--data", str(folder), "--out", str(tmp_path / "folder"), *QUICK]) == 0
    assert cli(["train", "--data", str(shards), "--out", str(tmp_path / "shards"), *QUICK, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["data"] == str(shards) and summary["final"]["split"] == "val"  # carved from train, seeded
    cfg = json.loads((tmp_path / "shards" / "config.json").read_text())
    assert cfg["data"]["val"] == 10 and cfg["data"]["train"] == 50 and cfg["data"]["label_key"] == "cls"
    a, b = load_file(tmp_path / "folder" / "last.safetensors"), load_file(tmp_path / "shards" / "last.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)
    # eval finds the run's data by the name it recorded, and carves the run's validation split again
    assert cli(["eval", str(tmp_path / "shards" / "best.safetensors"), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["data"] == str(shards) and scored["split"] == "val" and scored["count"] == 10


def test_eval_and_embed_read_the_shards_with_the_runs_label_key(tmp_path, capsys):
    """A run trained with --set data.label_key=species: `vitkit eval` without --data reads the shards with that
    key again (the default key, .txt, names other classes), and `embed --set data.label_key=` labels its rows."""
    import webdataset as wds

    for split, n in (("train", 12), ("val", 6)):
        with wds.ShardWriter(str(tmp_path / f"{split}-%03d.tar"), maxcount=8, verbose=0) as sink:
            for i in range(n):
                sink.write({"__key__": f"{split}{i:04d}", "png": _png(20 * i), "txt": ["dog", "cat"][i % 2],
                            "json": {"species": "owl" if i % 3 == 0 else "fox"}})
    run = tmp_path / "run"
    assert cli(["train", "--data", str(tmp_path), "--out", str(run), "--model", "vit_pico_patch2_8",
                "--set", "data.label_key=species", "--set", "in_chans=3", *QUICK]) == 0
    capsys.readouterr()
    assert cli(["eval", str(run / "best.safetensors"), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["class_names"] == ["fox", "owl"] and scored["split"] == "val" and scored["count"] == 6
    assert scored["data_options"] == {"label_key": "species"} and sum(c["support"] for c in scored["per_class"]) == 6
    assert [c["support"] for c in scored["per_class"]] == [4, 2]  # owl: samples 0 and 3 of val
    alone = tmp_path / "alone.safetensors"  # away from its run folder: the command in its provenance says it
    alone.write_bytes((run / "best.safetensors").read_bytes())
    assert cli(["eval", str(alone), "--data", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["data_options"] == {"label_key": "species"}
    # the same data read with the default key is other labels: said in one line, not scored as if it were the same
    assert cli(["eval", str(run / "best.safetensors"), "--set", "data.label_key=txt"]) == 2
    assert "label(s) ['cat', 'dog'] are not among the model's classes ['fox', 'owl']" in capsys.readouterr().err
    assert cli(["eval", str(run / "best.safetensors"), "--set", "label_key=txt"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith("got 'label_key=txt'")
    assert cli(["embed", str(run / "best.safetensors"), str(tmp_path), "--out", str(tmp_path / "emb"),
                "--set", "data.label_key=species", "--quiet", "--workers", "0"]) == 0
    rows = Embeddings(tmp_path / "emb").rows
    assert len(rows) == 18 and rows[0]["label"] == "owl" and rows[1]["label"] == "fox"


def test_interrupted_mid_epoch_and_resumed_from_shards_reaches_the_same_weights(digits, tmp_path, monkeypatch):
    """A real SIGINT at step 3 of 4 (inside epoch 2): the saved state resumes at that sample position."""
    _, shards = digits
    args = ["--data", str(shards), "--epochs", "2", "--set", "steps_per_epoch=2", "--set", "batch_size=8",
            "--set", "threads=1", "--set", "eval_batch_size=64", "--quiet"]
    assert cli(["train", "--out", str(tmp_path / "straight"), *args]) == 0
    from vitkit.training import trainer

    real_step_seed = trainer.step_seed

    def interrupt_at_step_3(seed, step, rank):  # the trainer seeds each step first: step 2 is the 3rd
        if step == 2:
            os.kill(os.getpid(), signal.SIGINT)  # the trainer's own handler flags it; the step still finishes
        return real_step_seed(seed, step, rank)

    monkeypatch.setattr(trainer, "step_seed", interrupt_at_step_3)
    assert cli(["train", "--out", str(tmp_path / "split"), *args]) == 130
    from vitkit.training.state import load_state

    info = load_state(tmp_path / "split" / "state.safetensors")["info"]
    assert info["epoch"] == 1 and info["batch_in_epoch"] == 1
    monkeypatch.setattr(trainer, "step_seed", real_step_seed)
    assert cli(["train", "--out", str(tmp_path / "split"), "--resume", "--quiet"]) == 0
    a, b = load_file(tmp_path / "straight" / "last.safetensors"), load_file(tmp_path / "split" / "last.safetensors")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)


# ---------------------------------------------------------------------------- bad input
def test_bad_specs_and_shards_are_one_line_each(tmp_path, capsys):
    sample = [("k0.png", _png()), ("k0.cls", b"0"), ("k1.png", _png()), ("k1.cls", b"1")]
    cases = {
        "matches no shard": str(tmp_path / "none-{000..009}.tar"),
        "glob matches no shard": str(tmp_path / "none-*.tar"),
        "some missing": str(tmp_path / "p-{000..002}.tar"),
        "empty file": str(tmp_path / "zero.tar"),
        "no samples": str(_tar(tmp_path / "nothing.tar", [])),
        "no label": str(_tar(tmp_path / "nolabel.tar", [*sample, ("k2.png", _png())])),
        "no image": str(_tar(tmp_path / "noimage.tar", [*sample, ("k2.cls", b"0")])),
        "bad cls": str(_tar(tmp_path / "badcls.tar", [("k0.png", _png()), ("k0.cls", b"cat")])),
        "gzip": str(tmp_path / "z.tar"),
        "list of missing": str(tmp_path / "list.shards"),
    }
    _tar(tmp_path / "p-000.tar", sample)
    (tmp_path / "zero.tar").write_bytes(b"")
    (tmp_path / "z.tar").write_bytes(b"\x1f\x8b\x08\x00" + bytes(60))
    (tmp_path / "list.shards").write_text("gone-000.tar\n")
    expected = {"matches no shard": "the pattern matches no shard", "glob matches no shard": "matches no shard",
                "some missing": "2 of the 3 shards the pattern names do not exist",
                "empty file": "empty shard (0 bytes)", "no samples": "empty shard (no samples)",
                "no label": "sample 'k2' has no label: no .cls member", "no image": "sample 'k2' has no image",
                "bad cls": "not an integer class", "gzip": "gzip-compressed shard",
                "list of missing": "1 listed shard(s) do not exist"}
    for case, spec in cases.items():
        with pytest.raises(DataError, match=expected[case].replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
            load_data(spec)
        assert cli(["train", "--data", spec, "--out", str(tmp_path / "run"), *QUICK]) == 2, case
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and expected[case] in err, (case, err)
    assert not (tmp_path / "run").exists()


def test_corrupt_and_truncated_shards_are_skipped_and_counted_or_stop_with_strict(tmp_path):
    members = [m for i in range(4) for m in ((f"k{i}.png", _png(i * 50)), (f"k{i}.cls", b"%d" % (i % 2)))]
    whole = _tar(tmp_path / "good-000.tar", members).read_bytes()
    # cut inside k3.png's bytes: k0..k2 stay, k3 is skipped
    (tmp_path / "good-001.tar").write_bytes(whole[:whole.index(_png(150)) + 20])
    # a corrupt header in the middle (k2.png's name field and beyond): tarfile would end the archive there
    # without a word
    corrupt = bytearray(whole)
    start = whole.index(b"k2.png")
    corrupt[start:start + 100] = b"\xff" * 100
    (tmp_path / "good-002.tar").write_bytes(bytes(corrupt))
    (tmp_path / "good-003.tar").write_bytes(os.urandom(3000))  # not a tar at all
    bundle = load_data(str(tmp_path / "good-{000..003}.tar"))
    assert len(bundle.train) == 4 + 3 + 2
    assert bundle.train.keys() == ["k0", "k1", "k2", "k3", "k0", "k1", "k2", "k0", "k1"]
    reasons = {Path(s["path"]).name: s["reason"] for s in bundle.info["skipped"]}
    assert bundle.info["num_skipped"] == 3 and set(reasons) == {"good-001.tar:k3", "good-002.tar", "good-003.tar"}
    assert "cut off by the end of the file" in reasons["good-001.tar:k3"]
    assert "corrupt tar header" in reasons["good-002.tar"] and "not a readable tar" in reasons["good-003.tar"]
    for i in range(len(bundle.train)):
        assert bundle.train[i][0].size == (8, 8)  # every kept sample decodes
    for shard, words in (("001", "cut off by the end"), ("002", "corrupt tar header"), ("003", "not a readable tar")):
        with pytest.raises(DataError, match=f"{words}.*--strict stops"):
            load_data(str(tmp_path / f"good-{shard}.tar"), strict=True)
