"""Hugging Face `datasets` as --data: real 8x8 digits written as PNG bytes into `datasets.Dataset`s (Image and
ClassLabel features), saved with save_to_disk, as Parquet (a hub-style folder and one file) and as an Arrow file,
then read back through load_data: the dataset's own splits and labels, pixels equal to the source images, keys,
skipped and unlabelled rows, a short training run from a save_to_disk folder, and one line for each bad input
(no image column, no label column, no usable split, `hf:` offline or missing on the hub, no datasets package).

`hf:` needs a hub and none is reachable from the tests: the offline cases run the real loader in a fresh
interpreter (HF_HUB_OFFLINE / HF_ENDPOINT are read at import) with an empty cache, and the hub's "no such
dataset" answer is played by a local HTTP server, as in test_hub.py."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import os
import pickle
import shutil
import socket
import tarfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import vitkit
from vitkit.cli.main import main as cli
from vitkit.data import hf_datasets
from vitkit.data.datasets import load_data
from vitkit.errors import DataError

datasets = pytest.importorskip("datasets")

CLASSES = [f"digit{i}" for i in range(10)]
PER_SPLIT = {"train": 5, "validation": 1, "test": 2}  # digits of each class in each split
QUICK = ["--epochs", "1", "--set", "steps_per_epoch=2", "--set", "batch_size=8", "--set", "threads=1",
         "--set", "eval_batch_size=64", "--quiet"]


def _png(pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def source():
    """{split: (8x8 uint8 images, labels, ids)}: the first sklearn digits of each class, split by PER_SPLIT."""
    from sklearn.datasets import load_digits

    d = load_digits()
    out = {split: ([], [], []) for split in PER_SPLIT}
    seen: dict[int, int] = {}
    for i, (img, y) in enumerate(zip(d.images, d.target)):
        n = seen.get(int(y), 0)
        bounds = np.cumsum(list(PER_SPLIT.values()))
        if n >= bounds[-1]:
            continue
        seen[int(y)] = n + 1
        split = list(PER_SPLIT)[int(np.searchsorted(bounds, n, side="right"))]
        out[split][0].append(np.uint8(np.round(img * 255 / 16)))
        out[split][1].append(int(y))
        out[split][2].append(f"sk{i}")
    return out


def _features(**extra):
    from datasets import ClassLabel, Features, Value
    from datasets import Image as ImageFeature

    return Features({"image": ImageFeature(), "label": ClassLabel(names=CLASSES), "id": Value("string")} | extra)


def _split(images, labels, ids):
    return datasets.Dataset.from_dict({"image": [{"bytes": _png(x), "path": None} for x in images],
                                       "label": labels, "id": ids}, features=_features())


@pytest.fixture(scope="module")
def saved(source, tmp_path_factory) -> dict[str, Path]:
    """The same DatasetDict as a save_to_disk folder, a hub-style Parquet folder, one Parquet file (train
    only) and one Arrow file (train only)."""
    root = tmp_path_factory.mktemp("hf")
    dd = datasets.DatasetDict({split: _split(*source[split]) for split in PER_SPLIT})
    dd.save_to_disk(str(root / "saved"))
    (root / "parquet" / "data").mkdir(parents=True)
    for split, ds in dd.items():
        ds.to_parquet(str(root / "parquet" / "data" / f"{split}-00000-of-00001.parquet"))
    dd["train"].to_parquet(str(root / "train.parquet"))
    dd["train"].save_to_disk(str(root / "train-only"))
    shutil.copy(next((root / "train-only").glob("*.arrow")), root / "train.arrow")
    return {"saved": root / "saved", "parquet": root / "parquet", "parquet_file": root / "train.parquet",
            "arrow_file": root / "train.arrow", "saved_dataset": root / "train-only"}


@pytest.fixture(scope="module", autouse=True)
def no_progress_bars():
    """The datasets these tests write would print progress bars into the stderr that the CLI tests read."""
    was_on = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    yield
    if was_on:
        datasets.enable_progress_bars()


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """load_dataset converts Parquet / Arrow files into its cache: a fresh one per test, not the user's."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def _pixels(ds, i) -> np.ndarray:
    return np.asarray(ds[i][0])


def test_save_to_disk_folder_gives_its_splits_labels_and_pixels(saved, source):
    bundle = load_data(str(saved["saved"]), channels=1)
    assert bundle.class_names == CLASSES and bundle.image_size == (8, 8) and bundle.channels == 1
    assert bundle.info["splits"] == {"train": "train", "val": "validation", "test": "test"}
    assert bundle.info["format"] == "save_to_disk" and bundle.info["num_skipped"] == 0
    assert bundle.name == os.path.abspath(saved["saved"])  # what a run records, and eval reads back
    for role, split in (("train", "train"), ("val", "validation"), ("test", "test")):
        ds = getattr(bundle, role)
        images, labels, ids = source[split]
        assert len(ds) == len(images) == 10 * PER_SPLIT[split]
        assert ds.labels.tolist() == labels and ds.keys() == ids
        for i in range(len(ds)):
            np.testing.assert_array_equal(_pixels(ds, i), images[i])
            assert ds[i][1] == labels[i]
    rgb = load_data(str(saved["saved"]), channels=3).test
    assert np.asarray(rgb[0][0]).shape == (8, 8, 3)
    np.testing.assert_array_equal(np.asarray(rgb[0][0]), np.repeat(source["test"][0][0][..., None], 3, axis=2))


@pytest.mark.parametrize("kind", ["parquet", "parquet_file", "arrow_file", "saved_dataset"])
def test_parquet_and_arrow_read_as_the_saved_folder(saved, source, kind):
    bundle = load_data(str(saved[kind]), channels=1)
    reference = load_data(str(saved["saved"]), channels=1)
    assert bundle.class_names == CLASSES
    expected = ("train", "val", "test") if kind == "parquet" else ("train",)  # a lone Dataset: all train
    assert [r for r in ("train", "val", "test") if getattr(bundle, r) is not None] == list(expected)
    for role in expected:
        got, want = getattr(bundle, role), getattr(reference, role)
        assert got.labels.tolist() == want.labels.tolist() and got.keys() == want.keys()
        for i in range(len(got)):
            np.testing.assert_array_equal(_pixels(got, i), _pixels(want, i))


def test_claims_only_its_own_specs(saved, tmp_path):
    for kind in saved:
        assert hf_datasets.claims(str(saved[kind])), kind
    assert hf_datasets.claims("hf:ylecun/mnist") and hf_datasets.claims("hf:ylecun/mnist:mnist")
    (tmp_path / "cls" / "a").mkdir(parents=True)  # a class-folder tree and a manifest are not datasets
    Image.new("L", (8, 8)).save(tmp_path / "cls" / "a" / "x.png")
    (tmp_path / "m.csv").write_text("cls/a/x.png,a\n")
    assert not hf_datasets.claims(str(tmp_path / "cls")) and not hf_datasets.claims(str(tmp_path / "m.csv"))
    assert not hf_datasets.claims("digits") and not hf_datasets.claims(str(tmp_path / "missing"))


def test_subset_keeps_rows_labels_and_keys_and_pickles(saved, source):
    train = load_data(str(saved["saved"]), channels=1).train
    part = train.subset([7, 2, 31])
    assert part.keys() == [source["train"][2][i] for i in (7, 2, 31)]
    assert part.labels.tolist() == [source["train"][1][i] for i in (7, 2, 31)]
    np.testing.assert_array_equal(_pixels(part, 0), source["train"][0][7])
    again = pickle.loads(pickle.dumps(part))  # DataLoader workers get the split this way
    np.testing.assert_array_equal(_pixels(again, 2), source["train"][0][31])


def test_undecodable_rows_are_skipped_and_counted_or_stop_with_strict(source, tmp_path):
    images, labels, ids = source["train"]
    cells = [{"bytes": _png(x), "path": None} for x in images]
    cells[3] = {"bytes": b"not an image at all", "path": None}
    cells[11] = {"bytes": _png(images[11])[:40], "path": None}  # truncated PNG
    ds = datasets.Dataset.from_dict({"image": cells, "label": labels, "id": ids}, features=_features())
    ds.save_to_disk(str(tmp_path / "broken"))
    bundle = load_data(str(tmp_path / "broken"), channels=1)
    assert len(bundle.train) == len(images) - 2 and bundle.info["num_skipped"] == 2
    assert [s["row"] for s in bundle.info["skipped"]] == ["train/3", "train/11"]
    assert "not an image file" in bundle.info["skipped"][0]["reason"]
    assert ids[3] not in bundle.train.keys() and ids[4] in bundle.train.keys()
    with pytest.raises(DataError, match="--strict") as e:
        load_data(str(tmp_path / "broken"), channels=1, strict=True)
    assert "\n" not in str(e.value) and "row 3" in str(e.value)


def test_plain_label_column_row_keys_unlabelled_and_extra_splits(source, tmp_path):
    """No ClassLabel: an int `label` column gives sorted class names; no id column: split/row keys; rows without
    a label (None; ClassLabel's -1, as in unlabelled test splits) are left out and counted; a split vitkit does
    not read is ignored."""
    from datasets import Features, Value
    from datasets import Image as ImageFeature

    features = Features({"image": ImageFeature(), "label": Value("int64")})

    def make(images, labels):
        return datasets.Dataset.from_dict({"image": [{"bytes": _png(x), "path": None} for x in images],
                                           "label": labels}, features=features)

    train_images, train_labels, train_ids = source["train"]
    test_images, test_labels, test_ids = source["test"]
    values = [y + 3 for y in train_labels]  # labels 3..12: names sorted numerically, not as text
    with_none = [None if i % 4 == 0 else y + 3 for i, y in enumerate(test_labels)]
    dd = datasets.DatasetDict(train=make(train_images, values), test=make(test_images, with_none),
                              extra=make(test_images, test_labels))
    dd.save_to_disk(str(tmp_path / "plain"))
    bundle = load_data(str(tmp_path / "plain"), channels=1)
    assert bundle.class_names == [str(v) for v in range(3, 13)]
    assert bundle.train.labels.tolist() == train_labels
    kept = [i for i in range(len(test_labels)) if i % 4]
    assert bundle.test.labels.tolist() == [test_labels[i] for i in kept]
    assert bundle.test.keys() == [f"test/{i}" for i in kept] and bundle.train.keys()[:2] == ["train/0", "train/1"]
    assert bundle.info["unlabeled"] == {"test": len(test_labels) - len(kept)}
    assert bundle.info["ignored_splits"] == ["extra"]

    unlabelled_test = datasets.DatasetDict(train=_split(train_images, train_labels, train_ids),
                                           test=_split(test_images, [-1] * len(test_images), test_ids))
    unlabelled_test.save_to_disk(str(tmp_path / "unlabelled-test"))
    bundle = load_data(str(tmp_path / "unlabelled-test"), channels=1)
    assert bundle.test is None and bundle.info["unlabeled"] == {"test": len(test_images)}


def test_named_columns_and_string_labels(source, tmp_path):
    from datasets import Features, Value
    from datasets import Image as ImageFeature

    images, labels, _ = source["train"]
    features = Features({"thumb": ImageFeature(), "photo": ImageFeature(), "kind": Value("string")})
    names = [CLASSES[y] for y in labels]
    ds = datasets.Dataset.from_dict({"thumb": [{"bytes": _png(np.zeros((8, 8), np.uint8)), "path": None}] * len(images),
                                     "photo": [{"bytes": _png(x), "path": None} for x in images], "kind": names},
                                    features=features)
    ds.save_to_disk(str(tmp_path / "named"))
    bundle = hf_datasets.load(str(tmp_path / "named"), channels=1, image_key="photo", label_key="kind")
    assert bundle.class_names == CLASSES and bundle.train.labels.tolist() == labels
    np.testing.assert_array_equal(_pixels(bundle.train, 5), images[5])
    with pytest.raises(DataError, match="no label column") as e:  # text is a label only when named
        load_data(str(tmp_path / "named"))
    assert "kind (Value string)" in str(e.value) and "data.label_key" in str(e.value)


def test_recipe_data_options_name_the_columns_and_unknown_ones_are_one_line(source, tmp_path, capsys):
    """`--set data.image_key=... --set data.label_key=...` reach the source (recorded in config.json); an option
    the source does not take, or any data option on a folder or built-in set, is one line."""
    from datasets import Features, Value
    from datasets import Image as ImageFeature

    images, labels, _ = source["train"]
    ds = datasets.Dataset.from_dict({"photo": [{"bytes": _png(x), "path": None} for x in images],
                                     "kind": [CLASSES[y] for y in labels]},
                                    features=Features({"photo": ImageFeature(), "kind": Value("string")}))
    ds.save_to_disk(str(tmp_path / "named"))
    out = tmp_path / "run"
    assert cli(["train", "--data", str(tmp_path / "named"), "--out", str(out), *QUICK, "--json",
                "--set", "data.image_key=photo", "--set", "data.label_key=kind"]) == 0
    capsys.readouterr()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["recipe"]["data_args"] == {"image_key": "photo", "label_key": "kind"}
    assert vitkit.load_model(out / "best.safetensors").class_names == CLASSES
    err = _one_line_cli_error(["train", "--data", str(tmp_path / "named"), "--out", str(tmp_path / "r2"), *QUICK,
                               "--set", "data.colour=red"], capsys)
    assert "data.colour" in err and "data.image_key" in err and not (tmp_path / "r2").exists()
    err = _one_line_cli_error(["train", "--data", "digits", "--out", str(tmp_path / "r3"), *QUICK,
                               "--set", "data.label_key=kind"], capsys)
    assert "data.label_key" in err and "digits" in err


def test_training_run_from_a_save_to_disk_folder(saved, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(["train", "--data", str(saved["saved"]), "--out", str(out), *QUICK, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["status"] == "done" and summary["final"]["split"] == "test" and summary["best"]["split"] == "val"
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["data"]["splits"]["val"] == "validation" and "val_split" not in cfg["data"]  # its own, not carved
    assert (cfg["data"]["train"], cfg["data"]["val"], cfg["data"]["test"]) == (50, 10, 20)
    model = vitkit.load_model(out / "best.safetensors")
    assert model.class_names == CLASSES
    # eval finds the data again from the run's record, and scores the dataset's own test split
    assert cli(["eval", str(out / "best.safetensors"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["split"] == "test" and result["count"] == 20, result


def _one_line_cli_error(argv, capsys) -> str:
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_datasets_are_one_line_each(source, tmp_path, capsys):
    from datasets import Features, Value
    from datasets import Image as ImageFeature

    images, labels, ids = source["train"]
    no_image = datasets.Dataset.from_dict({"path": [f"{i}.png" for i in ids], "label": labels},
                                          features=Features({"path": Value("string"), "label": Value("int64")}))
    no_image.save_to_disk(str(tmp_path / "no-image"))
    err = _one_line_cli_error(["train", "--data", str(tmp_path / "no-image"), "--out", str(tmp_path / "r1"), *QUICK], capsys)
    assert "no image column" in err and "path (Value string)" in err and "label (Value int64)" in err
    assert not (tmp_path / "r1").exists()

    no_label = datasets.Dataset.from_dict({"image": [{"bytes": _png(x), "path": None} for x in images]},
                                          features=Features({"image": ImageFeature()}))
    no_label.save_to_disk(str(tmp_path / "no-label"))
    err = _one_line_cli_error(["train", "--data", str(tmp_path / "no-label"), "--out", str(tmp_path / "r2"), *QUICK], capsys)
    assert "no label column" in err and "image (Image)" in err

    odd_splits = datasets.DatasetDict(first=_split(images, labels, ids), second=_split(images, labels, ids))
    odd_splits.save_to_disk(str(tmp_path / "odd-splits"))
    err = _one_line_cli_error(["train", "--data", str(tmp_path / "odd-splits"), "--out", str(tmp_path / "r3"), *QUICK], capsys)
    assert "no train split" in err and "'first', 'second'" in err

    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    err = _one_line_cli_error(["train", "--data", str(tmp_path / "bad.parquet"), "--out", str(tmp_path / "r4"), *QUICK], capsys)
    assert "cannot read it as a Hugging Face dataset" in err

    from datasets import ClassLabel

    renamed = _split(*source["test"]).cast_column("label", ClassLabel(names=[f"d{i}" for i in range(10)]))
    datasets.DatasetDict(train=_split(images, labels, ids), test=renamed).save_to_disk(str(tmp_path / "renamed"))
    with pytest.raises(DataError, match="split 'test' names its classes differently"):
        load_data(str(tmp_path / "renamed"))

    ds_dir = tmp_path / "no-image"
    with pytest.raises(DataError, match="no column 'pixels'"):
        hf_datasets.load(str(ds_dir), image_key="pixels")
    with pytest.raises(DataError, match="not an Image feature"):
        hf_datasets.load(str(ds_dir), image_key="path")
    with pytest.raises(DataError, match="no column 'cls'"):
        hf_datasets.load(str(tmp_path / "no-label"), label_key="cls")


def _in_fresh_python(fresh_python, code: str, hf_home: Path, cwd: Path, **env_vars):
    """`code` in a fresh interpreter (huggingface_hub and datasets read HF_* at import) whose hub and datasets
    caches are under `hf_home` -> (CompletedProcess, seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "VITKIT_DEBUG"}
    env |= dict(HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1") | env_vars
    start = time.monotonic()
    res = fresh_python.run(code, env=env, cwd=cwd, timeout=120)
    return res, time.monotonic() - start


def _hub_in_fresh_python(fresh_python, tmp_path, **env_vars):
    """`vitkit train --data hf:vitkit-tests/no-such-set` with empty caches -> (CompletedProcess, seconds)."""
    argv = ["train", "--data", "hf:vitkit-tests/no-such-set", "--out", str(tmp_path / "run"), *QUICK]
    code = f"import sys\nfrom vitkit.cli.main import main\nsys.exit(main({argv!r}))\n"
    return _in_fresh_python(fresh_python, code, tmp_path / "hf-home", tmp_path, **env_vars)


def _unused_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return port


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "unreachable"])
def test_hub_dataset_offline_fails_at_once_with_one_line(fresh_python, tmp_path, how):
    env = {"HF_ENDPOINT": f"http://127.0.0.1:{_unused_port()}"} if how == "unreachable" else {how: "1"}
    res, seconds = _hub_in_fresh_python(fresh_python, tmp_path, **env)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, err
    assert "vitkit-tests/no-such-set" in err and "not in the cache" in err and "save_to_disk" in err, err
    assert ("not reachable" if how == "unreachable" else "offline mode is on") in err, err
    assert "Retrying" not in res.stderr and seconds < 30  # datasets alone retries an unreachable hub ~25 s


class _HubSaysNoSuchDataset(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


def test_hub_without_the_dataset_is_not_offline(fresh_python, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _HubSaysNoSuchDataset)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        res, _ = _hub_in_fresh_python(fresh_python, tmp_path, HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, err
    assert "no dataset 'vitkit-tests/no-such-set' on the hub" in err and "cache" not in err, err


def test_without_the_datasets_package_says_which_extra(fresh_python, saved, tmp_path):
    argv = ["train", "--data", str(saved["saved"]), "--out", str(tmp_path / "run"), *QUICK]
    code = f"import sys\nfrom vitkit.cli.main import main\nsys.exit(main({argv!r}))\n"
    env = {k: v for k, v in os.environ.items() if k != "VITKIT_DEBUG"}
    res = fresh_python.run(code, env=env, cwd=tmp_path, blocked=["datasets"], timeout=120)
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, err
    assert "pip install 'vitkit[hf]'" in err and "datasets" in err


def test_loading_prints_no_progress_bars(fresh_python, saved, tmp_path):
    """datasets draws progress bars on stderr by default; a run's stderr is vitkit's own (and --quiet quiet)."""
    code = ("from vitkit.data.datasets import load_data\n"
            f"print(len(load_data({str(saved['parquet'])!r}).train))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")} | {"HF_HOME": str(tmp_path / "hf-home")}
    res = fresh_python.run(code, env=env, cwd=tmp_path, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "50", res.stderr
    assert res.stderr.strip() == "", res.stderr


HUB_REPO = "vitkit-tests/digits"
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _fake_hub(files: dict[str, bytes]) -> http.server.ThreadingHTTPServer:
    """The hub's answers for one dataset repo, as datasets' loader asks them (repo info, file HEAD/GET under
    resolve/, the file tree): enough for `load_dataset(HUB_REPO)` to run its real code against 127.0.0.1."""
    def entry(name: str) -> dict:
        return {"type": "file", "path": name, "size": len(files[name]), "oid": hashlib.sha1(files[name]).hexdigest()}

    class Hub(http.server.BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes = b"", headers: dict | None = None):
            self.send_response(code)
            for k, v in ({"X-Repo-Commit": HUB_COMMIT, "Content-Length": str(len(body))} | (headers or {})).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            path = self.path.split("?")[0]
            api = f"/api/datasets/{HUB_REPO}"
            if path in (api, f"{api}/revision/main", f"{api}/revision/{HUB_COMMIT}"):
                info = {"id": HUB_REPO, "sha": HUB_COMMIT, "private": False, "gated": False, "disabled": False,
                        "siblings": [{"rfilename": f} for f in files], "tags": [], "cardData": {}}
                return self._send(200, json.dumps(info).encode())
            for rev in ("main", HUB_COMMIT):
                if path.startswith(prefix := f"/datasets/{HUB_REPO}/resolve/{rev}/"):
                    name = path[len(prefix):]
                    if name in files:
                        return self._send(200, files[name], {"ETag": f'"{entry(name)["oid"]}"'})
                if path.startswith(prefix := f"{api}/tree/{rev}"):
                    folder = path[len(prefix):].strip("/")
                    inside = [f for f in files if not folder or f.startswith(folder + "/")]
                    depth = len(folder.split("/")) if folder else 0
                    listed = [entry(f) for f in inside if f.count("/") == depth]
                    listed += [{"type": "directory", "path": d, "oid": "0" * 40, "size": 0}
                               for d in sorted({"/".join(f.split("/")[:depth + 1]) for f in inside if f.count("/") > depth})]
                    return self._send(200, json.dumps(listed).encode())
            return self._send(404, headers={"X-Error-Code": "EntryNotFound"})

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _against_the_digits_hub(fresh_python, saved, code: str, tmp_path: Path):
    """`code` in a fresh interpreter whose hub is a local stand-in serving the digits as Parquet files in data/
    (the hub's usual layout), caches under tmp_path/hf-home -> CompletedProcess."""
    files = {"README.md": b"---\nlicense: bsd-3-clause\n---\n# digits\n"}
    files |= {f"data/{p.name}": p.read_bytes() for p in (saved["parquet"] / "data").glob("*.parquet")}
    server = _fake_hub(files)
    try:
        res, _ = _in_fresh_python(fresh_python, code, tmp_path / "hf-home", tmp_path,
                                  HF_ENDPOINT=f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    return res


def test_hub_dataset_loads_and_then_loads_offline_from_the_cache(fresh_python, saved, source, tmp_path):
    """`hf:NAME` through datasets' real hub loader against a local stand-in for the hub (Parquet files in
    data/, the hub's usual layout); then, with the hub unreachable, from its cache."""
    code = ("import json\nimport numpy as np\nfrom vitkit.data.datasets import load_data\n"
            f"b = load_data('hf:{HUB_REPO}', channels=1)\n"
            "print(json.dumps({'splits': b.info['splits'], 'name': b.name, 'test_keys': b.test.keys(),\n"
            "                  'train_labels': b.train.labels.tolist(),\n"
            "                  'pixels': [np.asarray(b.val[i][0]).tolist() for i in range(len(b.val))]}))\n")
    online = _against_the_digits_hub(fresh_python, saved, code, tmp_path)
    assert online.returncode == 0, online.stderr
    got = json.loads(online.stdout)
    assert got["splits"] == {"train": "train", "val": "validation", "test": "test"} and got["name"] == f"hf:{HUB_REPO}"
    assert got["train_labels"] == source["train"][1] and got["test_keys"] == source["test"][2]
    np.testing.assert_array_equal(np.asarray(got["pixels"], np.uint8), np.stack(source["validation"][0]))
    # the hub gone: vitkit's one request finds it unreachable and datasets reads the cache, without retries
    again, _ = _in_fresh_python(fresh_python, code, tmp_path / "hf-home", tmp_path,
                                HF_ENDPOINT=f"http://127.0.0.1:{_unused_port()}")
    assert again.returncode == 0 and json.loads(again.stdout) == got, again.stderr
    assert "Retrying" not in again.stderr


# ---------------------------------------------------------------------------- streaming, into shards
def _tar_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.tar"))}


def test_a_streamed_dataset_converts_to_the_shards_of_the_loaded_one(saved, source, tmp_path, capsys):
    """`vitkit shards DATASET --set data.streaming=true` reads the Parquet files in place, row by row (datasets'
    streaming), and writes the same shards, byte for byte, as the conversion of the loaded save_to_disk copy;
    the shards read back as the dataset: classes, labels and pixels per split."""
    assert cli(["shards", str(saved["parquet"]), "--out", str(tmp_path / "streamed"), "--per-shard", "16",
                "--set", "data.streaming=true", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["samples"] == {"train": 50, "val": 10, "test": 20} and res["shards"] == {"train": 4, "val": 1, "test": 2}
    assert res["classes"] == CLASSES and res["num_skipped"] == 0
    assert cli(["shards", str(saved["saved"]), "--out", str(tmp_path / "loaded"), "--per-shard", "16"]) == 0
    assert _tar_bytes(tmp_path / "streamed") == _tar_bytes(tmp_path / "loaded")
    back, reference = load_data(str(tmp_path / "streamed"), channels=1), load_data(str(saved["saved"]), channels=1)
    assert back.class_names == CLASSES
    for role in ("train", "val", "test"):
        got, want = getattr(back, role), getattr(reference, role)
        assert got.labels.tolist() == want.labels.tolist()
        for i in range(len(got)):
            np.testing.assert_array_equal(_pixels(got, i), _pixels(want, i))
    # where the sample came from: the dataset's own row key
    with tarfile.open(tmp_path / "streamed" / "test-000000.tar") as tar:
        about = json.loads(tar.extractfile("test/000000.json").read())
    assert about == {"label": CLASSES[source["test"][1][0]], "source": source["test"][2][0]}


def test_a_stream_without_a_class_list_skips_unlabelled_and_unreadable_rows(source, tmp_path, capsys):
    """Plain integer labels (no ClassLabel): the classes are known only after a full pass, so the samples carry
    their label in .json and no class file is written; rows without a label and undecodable images are
    skipped and counted (or stop with --strict)."""
    from datasets import Features, Value
    from datasets import Image as ImageFeature

    images, labels, _ = source["train"]
    cells = [{"bytes": _png(x), "path": None} for x in images]
    cells[3] = {"bytes": b"\x89PNG\r\n\x1a\n broken", "path": None}
    values = [None if i == 5 else y + 3 for i, y in enumerate(labels)]
    ds = datasets.Dataset.from_dict({"image": cells, "label": values},
                                    features=Features({"image": ImageFeature(), "label": Value("int64")}))
    ds.to_parquet(str(tmp_path / "plain.parquet"))
    assert cli(["shards", str(tmp_path / "plain.parquet"), "--out", str(tmp_path / "s"), "--per-shard", "100",
                "--set", "data.streaming=true", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["samples"] == {"train": 48} and res["num_skipped"] == 2 and res["classes"] is None
    assert not (tmp_path / "s" / "classes.json").exists()
    back = load_data(str(tmp_path / "s"), channels=1)
    kept = [i for i in range(len(labels)) if i not in (3, 5)]
    assert back.info["label_key"] == "label" and back.class_names == [str(v) for v in range(3, 13)]
    assert back.train.labels.tolist() == [labels[i] for i in kept]
    np.testing.assert_array_equal(_pixels(back.train, 3), images[kept[3]])
    assert cli(["shards", str(tmp_path / "plain.parquet"), "--out", str(tmp_path / "s2"), "--strict",
                "--set", "data.streaming=true"]) == 2
    assert "--strict stops at the first unreadable image" in capsys.readouterr().err


def test_training_on_a_stream_says_to_convert_it_first(saved, tmp_path, capsys):
    err = _one_line_cli_error(["train", "--data", str(saved["parquet"]), "--out", str(tmp_path / "r"),
                               "--set", "data.streaming=true", *QUICK], capsys)
    assert "vitkit shards" in err and "--set data.streaming=true --out DIR" in err
    assert not (tmp_path / "r").exists()
    err = _one_line_cli_error(["shards", str(saved["parquet"]), "--out", str(tmp_path / "s"),
                               "--set", "data.streaming=maybe"], capsys)
    assert "data.streaming takes true or false, got 'maybe'" in err


def test_streaming_a_hub_dataset_offline_is_one_line(fresh_python, tmp_path):
    argv = ["shards", "hf:vitkit-tests/no-such-set", "--out", str(tmp_path / "s"), "--set", "data.streaming=true"]
    code = f"import sys\nfrom vitkit.cli.main import main\nsys.exit(main({argv!r}))\n"
    res, seconds = _in_fresh_python(fresh_python, code, tmp_path / "hf-home", tmp_path, HF_HUB_OFFLINE="1")
    err = res.stderr.strip()
    assert res.returncode == 2 and len(err.splitlines()) == 1, err
    assert "cannot stream hub dataset 'vitkit-tests/no-such-set': offline mode is on" in err and seconds < 30


def test_a_hub_dataset_streams_into_shards(fresh_python, saved, tmp_path):
    """`hf:NAME` streamed through datasets' real hub code (byte ranges of the Parquet files from a local
    stand-in for the hub), into the same shards as the local conversion."""
    argv = ["shards", f"hf:{HUB_REPO}", "--out", str(tmp_path / "hub"), "--per-shard", "16", "--set",
            "data.streaming=true"]
    code = f"import sys\nfrom vitkit.cli.main import main\nsys.exit(main({argv!r}))\n"
    res = _against_the_digits_hub(fresh_python, saved, code, tmp_path)
    assert res.returncode == 0, res.stderr
    assert cli(["shards", str(saved["saved"]), "--out", str(tmp_path / "local"), "--per-shard", "16"]) == 0
    assert _tar_bytes(tmp_path / "hub") == _tar_bytes(tmp_path / "local")
    cached = [p for p in (tmp_path / "hf-home").rglob("*") if p.suffix in (".arrow", ".parquet")]
    assert not cached  # streamed: nothing downloaded whole into datasets' cache
