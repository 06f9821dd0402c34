"""What `vitkit train` says on its console (issue 20): counts in words, the resolution, the position-table
resample, the EMA wording, an ETA from a moving window after warm-up, a finished run's --resume, and the
stale temp files a killed write leaves in the run folder."""
from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from vitkit.cli.main import main as cli

QUICK = ["--epochs", "1", "--set", "steps_per_epoch=2", "--set", "batch_size=8", "--set", "threads=1"]


def _train(argv: list[str]) -> tuple[int, str]:
    """`vitkit train ARGV` in this process -> (exit code, what it printed on stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli(["train", *argv])
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A real finished run on an image folder with one unreadable file, EMA on: (run folder, its stderr)."""
    from PIL import Image

    root = tmp_path_factory.mktemp("console")
    data = root / "images"
    for label, shade in (("dark", 40), ("light", 215)):
        (data / label).mkdir(parents=True)
        for i in range(12):
            Image.new("L", (8, 8), shade + i).save(data / label / f"{i}.png")
    (data / "light" / "broken.png").write_bytes(b"not a png")
    run = root / "run"
    rc, err = _train(["--data", str(data), "--out", str(run), *QUICK, "--set", "ema=true"])
    assert rc == 0, err
    return run, err


def test_counts_are_words_and_the_header_states_the_resolution(finished):
    run, err = finished
    header = err.splitlines()[0]
    assert "1 epoch x 2 steps" in header and "1 epochs" not in header, header
    assert "1 process," in header and "process(es)" not in header, header
    assert "at 8x8 px" in header, header  # the resolution the model trains at
    assert "1 torch thread per process" in err and "thread(s)" not in err, err
    assert "skipped 1 unreadable image " in err and "image(s)" not in err, err
    done = next(line for line in err.splitlines() if line.startswith("done:"))
    assert "after 1 epoch in" in done, done
    assert "skipped 1 unreadable image:" in (run / "report.md").read_text()


def test_the_epoch_line_says_without_ema_not_raw(finished):
    _, err = finished
    line = next(line for line in err.splitlines() if line.startswith("epoch 1/1 loss"))
    assert "raw" not in line and re.search(r"\(without EMA \d+\.\d\d%?\)", line), line


def test_resume_of_a_finished_run_says_so_and_does_nothing(finished):
    run, _ = finished
    before = {p.name: p.stat().st_mtime_ns for p in run.iterdir()}
    rc, err = _train(["--out", str(run), "--resume"])
    assert rc == 0
    assert err.strip().splitlines() == [f"run {run} already finished (1/1 epoch); nothing to do"], err
    assert {p.name: p.stat().st_mtime_ns for p in run.iterdir()} == before  # nothing rewritten
    rc, err = _train(["--out", str(run), "--resume", "--json"])  # --json still gets the run's summary
    assert rc == 0 and "already finished" in err
    # killed after its last epoch, before the summary: --resume writes the final evaluation, with no empty bar
    (run / "summary.json").unlink()
    rc, err = _train(["--out", str(run), "--resume"])
    assert rc == 0 and json.loads((run / "summary.json").read_text())["status"] == "done"
    assert err.splitlines()[0] == f"resuming {run} after its last epoch (1/1 epoch) for the final evaluation and report"
    assert "━" not in err and "loss nan" not in err, err


def test_finetune_says_the_position_table_was_resampled(tmp_path, caplog):
    """A timm checkpoint (random weights, 32 px, patch 4: an 8x8 grid) fine-tuned at 16 px: the 8x8 -> 4x4
    resample is said by default (a warning, as the head re-init is), and the header states 16x16 px."""
    import timm
    from safetensors.torch import save_file

    src = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, depth=1,
                            num_classes=5)
    ckpt = tmp_path / "timm_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(ckpt))
    caplog.set_level(logging.WARNING, logger="vitkit")
    rc, err = _train(["--finetune", str(ckpt), "--data", "digits", "--img-size", "16", "--out", str(tmp_path / "ft"),
                      "--epochs", "1", "--set", "steps_per_epoch=1", "--set", "batch_size=16", "--set", "threads=1"])
    assert rc == 0, err
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("position embeddings resampled 8x8 -> 4x4 for 16x16 px" in m for m in said), said
    assert "at 16x16 px" in err.splitlines()[0], err


# ------------------------------------------------------------------------------------------------ the ETA
def test_eta_ignores_the_warm_up_and_follows_recent_steps():
    from vitkit.training.console import Eta

    eta = Eta(steps_left=100, warmup=2, window=4)
    for seconds in (9.0, 2.0):  # the first steps pay for allocation and lazy initialisation
        eta.record(seconds)
        assert eta.seconds_left() is None and eta.text() == ""
    for seconds in (0.2, 0.2, 0.2):
        eta.record(seconds)
    assert eta.seconds_left() == pytest.approx(95 * 0.2)  # not 99 x the first step's 9 s
    assert eta.text() == "~20 s left"
    for seconds in (0.5, 0.5, 0.5, 0.5):  # the window moves: the machine got busier
        eta.record(seconds)
    assert eta.seconds_left() == pytest.approx(91 * 0.5)
    for _ in range(91):
        eta.record(0.5)
    assert eta.seconds_left() == 0


def test_a_plan_made_at_the_last_step_redraws_the_bar_with_the_planned_epochs(capsys):
    """A time budget planned at the epoch's last step: the bar says 1 epoch and no hours left, not the
    placeholder run length it started with."""
    from vitkit.training.budget import MAX_EPOCHS
    from vitkit.training.console import Reporter, StepBar

    steps = 7
    bar = StepBar(Reporter(), MAX_EPOCHS * steps, 0, 0, MAX_EPOCHS, announce_eta=False, disable=False)
    with bar:
        for _ in range(steps):
            bar.step(2.3, 1e-4, 100.0, 0, 0.5)
        bar.replan(steps, steps, 1)
    err = capsys.readouterr().err
    assert "epoch 1/1 " in err and str(MAX_EPOCHS) not in err and " h " not in err, err


def test_durations_are_stated_as_approximate():
    from vitkit.training.console import approx_duration, count

    assert (approx_duration(0.3), approx_duration(9.4), approx_duration(42)) == ("~1 s", "~9 s", "~40 s")
    assert approx_duration(205) == "~3 min"
    assert approx_duration(3 * 3600 + 125) == "~3 h 02 min"
    assert (count(1, "epoch"), count(2, "epoch"), count(1, "process"), count(3, "process")) == \
        ("1 epoch", "2 epochs", "1 process", "3 processes")
    assert (count(0, "patch", "patches"), count(2, "step")) == ("0 patches", "2 steps")


def test_heavy_cpu_run_prints_an_eta_after_warm_up(tmp_path):
    """A 224 px model on the CPU (a 56 px patch keeps it cheap) gets one ETA line, from the steps after
    the warm-up, said as approximate."""
    rc, err = _train(["--out", str(tmp_path / "run"), "--epochs", "1", "--set", "steps_per_epoch=10",
                      "--set", "batch_size=4", "--set", "threads=1", "--set", "img_size=224",
                      "--set", 'model_args={"patch_size": 56}', "--set", "eval_batch_size=512"])
    assert rc == 0, err
    lines = [line for line in err.splitlines() if line.startswith("ETA")]
    assert len(lines) == 1, err
    assert re.search(r"steps take ~[\d.]+ s each after 2 warm-up steps: ~\d+ s for the \d steps left", lines[0]), lines
    assert "first step" not in err and "an ETA follows the first step" not in err


# ----------------------------------------------------------------------------------- stale temp files
def _bytes_in(temp: Path) -> int:
    """The bytes a temp holds (atomic_path's temp is a folder; a library's own temp file may be inside)."""
    return sum(f.stat().st_size for f in temp.rglob("*") if f.is_file()) if temp.is_dir() else temp.stat().st_size


def _train_in_child(argv: list[str], log: str) -> None:
    """A forked `vitkit train` (torch already imported: it starts training at once, not 8 s later)."""
    sys.stdout = sys.stderr = open(log, "a", buffering=1)  # noqa: SIM115
    os._exit(cli(["train", *argv]))


def test_sigkill_during_the_state_save_then_resume_removes_the_temp_files(tmp_path):
    """A real `vitkit train` process is SIGKILLed while it writes state.safetensors. On --resume the partial
    temp file goes, and so does one carrying this process's pid (a restarted container reuses pids), with one
    line saying what was freed; a live writer's temp file and the user's own files stay."""
    import multiprocessing

    import sklearn.datasets  # noqa: F401  (what the run imports, imported before the fork: it trains at once)

    import vitkit.training.report  # noqa: F401
    import vitkit.training.trainer  # noqa: F401

    run = tmp_path / "run"
    argv = ["--out", str(run), "--epochs", "100", "--quiet", "--set", "steps_per_epoch=1", "--set", "batch_size=8",
            "--set", "threads=1", "--set", 'model_args={"embed_dim": 192}', "--set", "eval_batch_size=512"]
    # from a fork server (a fresh interpreter that imported the run's modules), not a fork of this process: torch
    # refuses autograd in a fork of a process that already ran autograd on a thread (an earlier test may have)
    server = multiprocessing.get_context("forkserver")
    server.set_forkserver_preload(["torch", "sklearn.datasets", "vitkit.cli.train", "vitkit.training.report",
                                   "vitkit.training.trainer"])
    child = server.Process(target=_train_in_child, args=(argv, str(tmp_path / "child.log")))
    child.start()
    deadline = time.time() + 120
    left: list[Path] = []
    try:
        while not left:
            assert child.exitcode is None, (f"the run ended on its own (exit {child.exitcode}): "
                                            + (tmp_path / "child.log").read_text(errors="replace")[-2000:])
            assert time.time() < deadline, "no state save seen"
            if (run / "state.safetensors").exists():  # a later save: --resume has a state to go on from
                with contextlib.suppress(FileNotFoundError):  # (a temp can go between listing and reading)
                    left = [p for p in run.glob(".state.safetensors.*") if _bytes_in(p)]
        os.kill(child.pid, signal.SIGKILL)  # mid-write: the temp file has bytes, not yet renamed
    finally:
        if child.exitcode is None:
            os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    assert child.exitcode == -signal.SIGKILL
    left = [p for p in left if p.exists()]  # (the save may have finished just before the kill landed)
    assert left, "the kill landed after the save; rerun"
    partial = left[0]
    assert not list(run.glob(".tmp*")), "a library's own temp file landed in the run folder"
    same_pid = run / f".state.safetensors.{os.getpid()}.k3x9q2ab.tmp"
    (shutil.copytree if partial.is_dir() else shutil.copyfile)(partial, same_pid)
    live_writer = run / f".last.safetensors.{os.getppid()}.w7r2m4zz.tmp"
    live_writer.write_bytes(b"in progress")
    users = [run / "notes.tmp", run / ".notes.tmp"]
    for p in users:
        p.write_text("mine")
    freed = _bytes_in(partial) + _bytes_in(same_pid)
    from vitkit.analysis.cost import format_bytes

    rc, err = _train(["--out", str(run), "--resume", "--stop-after-epochs", "2"])
    assert rc == 0, err
    assert f"removed 2 stale temp files ({format_bytes(freed)}) left by interrupted writes" in err, err
    assert not partial.exists() and not same_pid.exists()
    assert live_writer.exists() and all(p.read_text() == "mine" for p in users)
    from vitkit.training.state import load_state

    assert load_state(run / "state.safetensors")["info"]["epoch"] >= 1
    json.loads((run / "config.json").read_text())
