"""The objective seam: ClassificationTask's loss and targets, and a new objective defined here that trains
through the real Trainer loop (digits) without any change to the loop."""
from __future__ import annotations

import json
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vitkit.training.recipes import Recipe
from vitkit.training.state import load_state
from vitkit.training.tasks import TASKS, ClassificationTask, Task
from vitkit.training.trainer import Trainer

CPU = torch.device("cpu")


def _task(recipe: Recipe, net: nn.Module | None = None, num_classes: int = 4) -> ClassificationTask:
    net = net or nn.Identity()  # the "model" returns its input: the batch's x are the logits
    return ClassificationTask(recipe, net, num_classes=num_classes, device=CPU)


def test_classification_loss_is_label_smoothed_cross_entropy_in_fp32():
    logits = torch.tensor([[2.0, -1.0, 0.5, 0.0], [0.1, 0.2, 3.0, -2.0], [-1.0, -1.0, -1.0, 4.0]])
    y = torch.tensor([0, 2, 1])
    task = _task(Recipe(label_smoothing=0.2, bf16=False))
    out = task((logits, y))
    assert out["batch_size"] == 3 and out["loss"].dtype == torch.float32
    torch.testing.assert_close(out["loss"], F.cross_entropy(logits, y, label_smoothing=0.2))
    # the formula itself: (1 - e) * NLL + e * mean over classes of -log p
    logp = logits.log_softmax(1)
    by_hand = (0.8 * -logp[torch.arange(3), y] + 0.2 * -logp.mean(1)).mean()
    torch.testing.assert_close(out["loss"], by_hand)
    # bf16 logits (autocast) are promoted to fp32 before the loss
    half = task.loss(logits.bfloat16(), y)
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, F.cross_entropy(logits.bfloat16().float(), y, label_smoothing=0.2))


def test_mixup_gives_soft_targets_until_the_last_epochs():
    recipe = Recipe(mixup=0.8, label_smoothing=0.0, epochs=5, mix_off_epochs=2, bf16=False)
    net = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    task = _task(recipe, net)
    x, y = torch.randn(8, 3, 2, 2), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    torch.manual_seed(0)
    task.on_epoch_start(0)
    out = task((x, y))
    t = out["target"]
    assert t.shape == (8, 4) and torch.allclose(t.sum(1), torch.ones(8))
    assert (t.max(1).values < 1).all()  # mixed: no row is one-hot
    torch.testing.assert_close(out["loss"], F.cross_entropy(out["logits"].float(), t))
    task.on_epoch_start(3)  # epochs 3 and 4 are the last two: mixing off
    out = task((x, y))
    assert torch.equal(out["target"], y)
    torch.testing.assert_close(out["loss"], F.cross_entropy(net(x), y))


class BrierTask(Task):
    """A regression-style objective: a small probe on the logits, mean squared error to one-hot targets.
    It owns a trainable module and a buffer (kept for --resume by nn.Module's own state_dict: nothing
    hand-written), and counts the hooks the loop calls."""

    def __init__(self, recipe, model, **kw):
        super().__init__(recipe, model, **kw)
        self.probe = nn.Linear(self.num_classes, self.num_classes)
        self.probe_init = self.probe.weight.detach().clone()
        self.epochs_started: list[int] = []
        self.steps_done: list[int] = []
        self.register_buffer("steps_seen", torch.zeros((), dtype=torch.long))

    def forward(self, batch) -> dict[str, Any]:
        assert self.training and self.model.training and self.probe.training  # the loop trains in train mode
        x, y = batch
        with self.autocast():
            logits = self.model(x)
        pred = self.probe(logits.float()).softmax(1)
        return {"loss": F.mse_loss(pred, F.one_hot(y, self.num_classes).float()), "batch_size": len(x)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        assert not model.training and not self.probe.training  # the loop evaluates in eval mode
        total, n = 0.0, 0
        for x, y in loader:
            pred = self.probe(model(x).float()).softmax(1)
            total += F.mse_loss(pred, F.one_hot(y, self.num_classes).float(), reduction="sum").item() / self.num_classes
            n += len(y)
        return {"loss": total / n, "score": -total / n}

    def on_epoch_start(self, epoch: int) -> None:
        self.epochs_started.append(epoch)

    def after_step(self, step: int) -> None:
        self.steps_done.append(step)
        self.steps_seen += 1


def test_a_new_objective_trains_through_the_unchanged_loop(tmp_path, monkeypatch):
    monkeypatch.setitem(TASKS, "brier", BrierTask)
    recipe = Recipe(task="brier", data="digits", epochs=4, steps_per_epoch=3, batch_size=32, threads=1, bf16=False,
                    warmup_epochs=0, lr=3e-3, eval_batch_size=512)
    trainer = Trainer(recipe, tmp_path / "run", quiet=True, stop_after_epochs=2)
    assert trainer.run()["status"] == "stopped"
    task = trainer.task
    assert isinstance(task, BrierTask) and task.epochs_started == [0, 1] and task.steps_done == [1, 2, 3, 4, 5, 6]
    # the loop logged the task's loss: MSE of probabilities (< 1), not a cross-entropy (~2.3 at the start)
    steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(1, 7)) and all(0 < s["loss"] < 0.2 for s in steps)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics] == [1, 2] and "eval_top1" not in metrics[0]
    assert all(0 < m["eval_loss"] < 0.2 for m in metrics)
    assert trainer.at.best["score"] == max(-m["eval_loss"] for m in metrics)  # the task's score picked best
    # the probe was trained by the optimiser and saved with the state
    assert any(task.probe.weight is p for g in trainer.optimizer.param_groups for p in g["params"])
    st = load_state(tmp_path / "run" / "state.safetensors")
    assert int(st["task"]["steps_seen"]) == 6
    torch.testing.assert_close(st["task"]["probe.weight"], task.probe.weight.detach())
    assert not torch.equal(task.probe_init, task.probe.weight)

    # --resume brings the task's state back and trains on
    resumed = Trainer(recipe, tmp_path / "run", resume=True, quiet=True, stop_after_epochs=3)
    assert resumed.run()["status"] == "stopped"
    assert int(resumed.task.steps_seen) == 9 and resumed.task.epochs_started == [2]
    assert resumed.task.steps_done == [7, 8, 9]

    # and runs to the end: summary and report carry the task's own numbers, no classifier's
    done = Trainer(recipe, tmp_path / "run", resume=True, quiet=True).run()
    assert done["status"] == "done" and "top1" not in done["final"] and 0 < done["final"]["loss"] < 0.2
    report = (tmp_path / "run" / "report.md").read_text()
    assert f"loss {done['final']['loss']:.4g}" in report and "top-1" not in report
    assert (tmp_path / "run" / "curves.png").stat().st_size > 0 and not (tmp_path / "run" / "confusion.png").exists()


OBJECTIVES = {
    "mae": {"decoder_dim": 32, "decoder_depth": 1},
    "dino": {"out_dim": 32, "hidden_dim": 32, "bottleneck_dim": 16, "n_local": 2},
    "classification": {},
}


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_ctrl_c_mid_epoch_and_resume_equal_an_uninterrupted_run(name, tmp_path, monkeypatch):
    """Ctrl-C inside an epoch (the loop stops after the step it is in, saving the state), then --resume: the
    same step losses and the same weights as a run never stopped, for each objective with state of its own."""
    import os
    import signal

    from safetensors.torch import load_file

    from vitkit.training.trainer import Interrupted

    base = TASKS[name]

    class CtrlC(base):  # Ctrl-C during optimiser step 5 of 6 (epoch 2 of 2, 3 steps each)
        def after_step(self, step: int) -> None:
            super().after_step(step)
            if step == 4:
                os.kill(os.getpid(), signal.SIGINT)

    recipe = Recipe(task=name, task_args=OBJECTIVES[name], data="digits", model="vit_pico_patch2_8", epochs=2,
                    steps_per_epoch=3, batch_size=16, threads=1, bf16=False, warmup_epochs=0, drop_path_rate=0.1,
                    eval_batch_size=512)
    Trainer(recipe, tmp_path / "straight", quiet=True).run()
    monkeypatch.setitem(TASKS, name, CtrlC)
    with pytest.raises(Interrupted):
        Trainer(recipe, tmp_path / "split", quiet=True).run()
    assert load_state(tmp_path / "split" / "state.safetensors")["info"]["step"] == 5
    monkeypatch.setitem(TASKS, name, base)
    Trainer(recipe, tmp_path / "split", resume=True, quiet=True).run()
    losses = [[json.loads(s)["loss"] for s in (tmp_path / r / "steps.jsonl").read_text().splitlines()]
              for r in ("straight", "split")]
    assert len(losses[0]) == 6 and losses[0] == pytest.approx(losses[1], rel=1e-6)
    a, b = load_file(str(tmp_path / "straight" / "last.safetensors")), load_file(str(tmp_path / "split" / "last.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)
