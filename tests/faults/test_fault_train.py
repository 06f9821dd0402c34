"""SIGKILL at random moments: during `vitkit train` (any phase, checkpoint writes included) and in a tight
checkpoint-writing loop. The last good checkpoint always loads, and `--resume` finishes the run."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.cli.main import build_parser, main

pytestmark = pytest.mark.slow
_FORK = mp.get_context("fork")  # a forked child starts in milliseconds (torch already imported)
# Training children come from a fork server: a fresh interpreter that imported what a run imports, then forks
# each child. Forking the test process itself is refused by torch ("autograd's threading in combination with
# fork") once any earlier test in it ran autograd on a thread, which the order of a parallel run decides.
_RUNS = mp.get_context("forkserver")
_RUNS.set_forkserver_preload(["torch", "sklearn.datasets", "vitkit.cli.train", "vitkit.training.report",
                              "vitkit.training.trainer"])

EPOCHS = 10
KILLS = 8  # plus 30 in the checkpoint-writer test below
RESUME = ["train", "--resume", "--quiet"]  # a resumed run takes everything else from its folder
TRAIN = ["train", "--recipe", "digits", "--epochs", str(EPOCHS), "--batch-size", "32", "--seed", "0",
         "--set", "train_subset=128", "--set", "threads=1", "--set", "warmup_epochs=1", "--quiet"]


def _has_train() -> bool:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return "train" in sub.choices


def _cli(argv: list[str], log: str) -> None:
    sys.stdout = sys.stderr = open(log, "a", buffering=1)  # noqa: SIM115
    os._exit(main(argv))


_LIVE: list = []


def _start(argv: list[str]):
    p = _RUNS.Process(target=_cli, args=(argv, os.environ.get("VK_CHILD_LOG", os.devnull)))
    p.start()
    _LIVE.append(p)
    return p


def _run_to_end(argv: list[str], timeout: float = 240) -> int:
    p = _start(argv)
    p.join(timeout)
    if p.exitcode is None:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        pytest.fail(f"`vitkit {' '.join(argv)}` did not finish within {timeout} s")
    return p.exitcode


@pytest.fixture(autouse=True)
def _no_orphans(tmp_path, monkeypatch):
    log = tmp_path / "children.log"  # what the forked runs printed: shown under a failing test
    monkeypatch.setenv("VK_CHILD_LOG", str(log))
    yield
    if log.exists():
        print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-40:]))
    while _LIVE:  # a failed assertion must not leave training processes behind
        p = _LIVE.pop()
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)
            p.join()


def _preload() -> None:
    """Import what a training run imports, so each forked run starts training at once."""
    import vitkit.cli.train
    import vitkit.training.report
    import vitkit.training.trainer  # noqa: F401


def _temp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


def _check_run_folder(run: Path, last_epoch: int) -> int:
    """Everything a killed run leaves must load; the saved epoch never goes backwards."""
    from vitkit.training.state import load_state

    if (run / "config.json").exists():
        json.loads((run / "config.json").read_text())
    for name in ("last.safetensors", "best.safetensors"):
        if (run / name).exists():
            model = vitkit.load_model(run / name).eval()
            with torch.no_grad():
                assert model(torch.zeros(1, 1, 8, 8)).shape == (1, 10)
    epoch = 0
    if (run / "state.safetensors").exists():
        epoch = load_state(run / "state.safetensors")["info"]["epoch"]
        assert epoch >= last_epoch, f"saved state went back from epoch {last_epoch} to {epoch}"
    return epoch


@pytest.mark.skipif(not _has_train(), reason="`vitkit train` does not exist yet")
def test_sigkill_during_training_then_resume(tmp_path):
    run, ref = tmp_path / "killed", tmp_path / "reference"
    _preload()
    rng = random.Random(1234)
    # Start the fork server first: its imports take seconds on a busy machine, and counted in the calibration
    # they stretched every kill window past a whole resumed run (CI saw 13 runs finish before 12 kills landed).
    warm = _RUNS.Process(target=int)
    warm.start()
    warm.join()
    # calibrate on this machine: the first run is killed just after its first epoch is saved
    t0 = time.perf_counter()
    p = _start(TRAIN + ["--out", str(run)])
    while not (run / "state.safetensors").exists() and p.exitcode is None and time.perf_counter() - t0 < 120:
        time.sleep(0.02)
    first_epoch_s = time.perf_counter() - t0
    time.sleep(rng.uniform(0.0, 0.3))
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    epoch = _check_run_folder(run, 0)
    assert epoch >= 1
    kills, finished, epochs_seen = 1, 0, [epoch]
    while kills < KILLS and kills + finished < 3 * KILLS:
        p = _start((RESUME if (run / "state.safetensors").exists() else TRAIN) + ["--out", str(run)])
        p.join(rng.uniform(0.2, 1.2 * first_epoch_s))  # anywhere: setup, mid-epoch, evaluation, checkpoint writes
        if p.exitcode is None:
            os.kill(p.pid, signal.SIGKILL)
            kills += 1
        p.join()
        epoch = _check_run_folder(run, epoch)
        epochs_seen.append(epoch)
        if p.exitcode == 0:  # it finished before the kill: start over to keep killing
            finished += 1
            shutil.rmtree(run)
            epoch = 0
        else:
            assert p.exitcode == -signal.SIGKILL, f"the run failed on its own (exit {p.exitcode})"
    assert kills >= KILLS, f"only {kills} kills landed ({finished} runs finished first)"

    # resume to the end
    argv = (RESUME if (run / "state.safetensors").exists() else TRAIN) + ["--out", str(run)]
    assert _run_to_end(argv) == 0, "the resumed run failed"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["epochs"] == EPOCHS
    _check_run_folder(run, EPOCHS)
    # (the logs' consistency after a kill is checked deterministically in test_logs_agree_with_state_after_kill)

    # the killed-and-resumed run ends with the same weights as an uninterrupted one
    assert _run_to_end(TRAIN + ["--out", str(ref)]) == 0
    got, want = load_file(str(run / "last.safetensors")), load_file(str(ref / "last.safetensors"))
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), "resume after SIGKILL changed the result"
    print(f"first epoch saved after {first_epoch_s:.1f} s; {kills} kills, saved epoch after each: {epochs_seen}; {len(_temp_files(run))} stale temp file(s) left by kills: {_temp_files(run)}")


def _writer(folder: str, start: int, model, opt) -> None:
    """Save a model and a training state over and over; each version's weights all equal its number."""
    from vitkit.training.state import save_state

    i = start
    while True:
        i += 1
        with torch.no_grad():
            for prm in model.parameters():
                prm.fill_(float(i))
        vitkit.save_model(model, Path(folder) / "model.safetensors")
        save_state(Path(folder) / "state.safetensors", model_sd=model.state_dict(), optimizer=opt, ema_sd=None,
                   info={"epoch": i})


def test_sigkill_during_checkpoint_writes(tmp_path):
    """30 kills of a process that does nothing but write checkpoints: every file is always one whole version."""
    from vitkit.training.state import load_state  # imported here so the forked writers start at once

    model = vitkit.create_model("vit_pico_patch2_8")
    opt = torch.optim.AdamW(model.parameters())
    rng = random.Random(99)
    seen_versions = set()
    last_model, last_state = 0, 0
    for kill in range(30):
        p = _FORK.Process(target=_writer, args=(str(tmp_path), 1000 * kill, model, opt))  # versions only grow
        p.start()
        _LIVE.append(p)
        time.sleep(rng.uniform(0.01, 0.4))
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        if (tmp_path / "model.safetensors").exists():
            model = vitkit.load_model(tmp_path / "model.safetensors")
            values = {float(t.flatten()[0]) for t in model.state_dict().values() if t.is_floating_point()}
            assert len(values) == 1, "a checkpoint mixes two versions"
            version = int(values.pop())
            assert version >= last_model, "an older checkpoint replaced a newer one"
            last_model = version
            seen_versions.add(version)
        if (tmp_path / "state.safetensors").exists():
            st = load_state(tmp_path / "state.safetensors")
            version = st["info"]["epoch"]
            assert version >= last_state and version <= last_model, (version, last_state, last_model)
            assert all(float(t.flatten()[0]) == version for t in st["model"].values() if t.is_floating_point())
            last_state = version
    assert len(seen_versions) >= 5, f"kills landed too early to test anything: {sorted(seen_versions)}"
    leftovers = _temp_files(tmp_path)
    assert len(leftovers) <= 60  # SIGKILL cannot clean up; at most one per target per kill
    print(f"{len(seen_versions)} distinct versions survived 30 kills; {len(leftovers)} stale temp file(s)")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not _has_train(), reason="`vitkit train` does not exist yet")
def test_logs_agree_with_state_after_kill(tmp_path):
    """The two windows a kill can hit at the end of an epoch, reproduced exactly: the next epoch's step lines
    flushed but its state not saved; a state saved but its metrics line not appended. After --resume the logs
    must hold every epoch and every step exactly once."""
    run = tmp_path / "run"
    _preload()
    epochs = 4
    argv = [a if a != str(EPOCHS) else str(epochs) for a in TRAIN]
    assert _run_to_end(argv + ["--out", str(run), "--stop-after-epochs", "2"]) == 0
    from vitkit.training.state import load_state

    state = load_state(run / "state.safetensors")["info"]
    assert state["epoch"] == 2
    metrics, steps = _jsonl(run / "metrics.jsonl"), _jsonl(run / "steps.jsonl")
    assert [m["epoch"] for m in metrics] == [1, 2] and steps[-1]["step"] == state["step"]
    # window 1: killed after epoch 2's state was saved, before its metrics line was appended
    (run / "metrics.jsonl").write_text(json.dumps(metrics[0]) + "\n")
    # window 2: epoch 3's step lines were flushed, then the kill came before epoch 3's state was saved
    with open(run / "steps.jsonl", "a") as f:
        f.writelines(json.dumps(dict(s, step=s["step"] + state["step"] // 2)) + "\n" for s in steps[len(steps) // 2:])
    assert _run_to_end(RESUME + ["--out", str(run)]) == 0
    total = state["step"] // 2 * epochs
    assert [m["epoch"] for m in _jsonl(run / "metrics.jsonl")] == list(range(1, epochs + 1))
    assert [s["step"] for s in _jsonl(run / "steps.jsonl")] == list(range(1, total + 1))
