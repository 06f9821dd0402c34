"""DeiT distillation: the KD losses against transcriptions of the reference formulas (facebookresearch/deit's
DistillationLoss and timm's TokenDistillationTask), the teacher's input re-normalisation, and a distilled
student trained from a ResNet teacher through the real trainer."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import vitkit
from vitkit.cli.main import main as cli
from vitkit.models import Preprocess
from vitkit.training.tasks.distillation import TeacherInput, distillation_loss


def deit_soft(outputs_kd, teacher_outputs, T):
    """facebookresearch/deit losses.py, soft branch (transcribed): summed KL with log targets, * T^2 / numel."""
    return F.kl_div(F.log_softmax(outputs_kd / T, dim=1), F.log_softmax(teacher_outputs / T, dim=1),
                    reduction="sum", log_target=True) * (T * T) / outputs_kd.numel()


def timm_soft(student, teacher, T):
    """timm's token distillation, soft: batchmean KL of the tempered distributions, * T^2."""
    return F.kl_div(F.log_softmax(student / T, dim=-1), F.log_softmax(teacher / T, dim=-1),
                    reduction="batchmean", log_target=True) * (T * T)


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_soft_kd_matches_both_references_and_they_differ_by_k(tau):
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(8, 10, generator=g) * 3, torch.randn(8, 10, generator=g) * 3
    deit = distillation_loss(s, t, "soft", tau, "deit")
    timm = distillation_loss(s, t, "soft", tau, "timm")
    torch.testing.assert_close(deit, deit_soft(s, t, tau))
    torch.testing.assert_close(timm, timm_soft(s, t, tau))
    torch.testing.assert_close(timm, deit * 10)  # K = 10 logits per sample
    # by hand for one sample: sum_k p_t (log p_t - log p_s) * T^2 / K
    p_t, log_s = (t[:1] / tau).softmax(1), (s[:1] / tau).log_softmax(1)
    by_hand = (p_t * (p_t.log() - log_s)).sum() * tau * tau / 10
    torch.testing.assert_close(distillation_loss(s[:1], t[:1], "soft", tau, "deit"), by_hand)


def test_hard_kd_is_cross_entropy_to_the_teachers_argmax():
    s = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    t = torch.tensor([[0.0, 9.0, 1.0], [0.0, 0.0, 3.0]])
    expected = (-s[0].log_softmax(0)[1] - s[1].log_softmax(0)[2]) / 2
    torch.testing.assert_close(distillation_loss(s, t, "hard"), expected)


def test_teacher_input_renormalises_channels_and_size():
    student = Preprocess((0.5,), (0.5,), "bilinear", 1.0, (1, 8, 8))
    teacher = Preprocess((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "bicubic", 1.0, (3, 16, 16))
    pixels = torch.rand(2, 1, 8, 8)
    out = TeacherInput(student, teacher)((pixels - 0.5) / 0.5)
    assert out.shape == (2, 3, 16, 16)
    up = F.interpolate(pixels.expand(-1, 3, -1, -1), size=(16, 16), mode="bilinear", antialias=True)
    mean, std = torch.tensor(teacher.mean).view(1, 3, 1, 1), torch.tensor(teacher.std).view(1, 3, 1, 1)
    torch.testing.assert_close(out, (up - mean) / std)
    same = TeacherInput(student, student)
    x = torch.randn(2, 1, 8, 8)
    assert same(x) is x


def test_a_distilled_student_learns_from_a_resnet_teacher(tmp_path):
    common = ["--data", "digits", "--epochs", "1", "--quiet", "--set", "steps_per_epoch=3", "--set", "batch_size=32",
              "--set", "threads=1", "--set", "bf16=false", "--set", "eval_batch_size=400"]
    assert cli(["train", "--model", "resnet18", "--out", str(tmp_path / "teacher"), *common]) == 0
    teacher = tmp_path / "teacher" / "best.safetensors"
    run = tmp_path / "student"
    assert cli(["train", "--model", "vit_pico_patch2_8", "--out", str(run), *common, "--set", "task=distillation",
                "--teacher", str(teacher), "--set", "task.kind=soft", "--set", "task.tau=3",
                *DISTILLED]) == 0
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["recipe"]["task"] == "distillation" and cfg["recipe"]["task_args"]["teacher"] == str(teacher)
    student = vitkit.load_model(run / "best.safetensors").eval()
    assert student.cfg.distilled and student.head_dist is not None
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():  # evaluation averages the two heads
        feats = student.forward_features(x)
        both = (student.head(student.fc_norm(student.pool(feats))) + student.head_dist(student.fc_norm(feats[:, 1]))) / 2
        torch.testing.assert_close(student(x), both)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "done" and 0 <= summary["final"]["top1"] <= 100


DISTILLED = ["--set", "model.distilled=true", "--set", "model.class_token=true", "--set", "model.global_pool=token"]


@pytest.mark.parametrize("extra, message", [
    (DISTILLED, "distillation needs a teacher"),
    (["--set", "task.teacher=bundled:fashion-mnist"], "needs a distillation token"),
    ([*DISTILLED, "--set", "task.teacher=bundled:fashion-mnist", "--set", "task.kind=warm"],
     "task.kind must be one of"),
])
def test_distillation_mistakes_are_one_line_errors(extra, message, tmp_path, capsys):
    assert cli(["train", "--data", "digits", "--out", str(tmp_path / "x"), "--set", "task=distillation", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_a_recipe_teacher_is_trained_first_then_reused(tmp_path, capsys):
    """`task.teacher=recipe:NAME` trains that preset into `task.teacher_out` first, reuses the finished run
    next time, and leaves the student's run as a ready teacher file would (the random state is restored)."""
    teacher_dir = tmp_path / "teacher"
    common = ["--data", "digits", "--model", "vit_pico_patch2_8", "--epochs", "1", "--quiet", "--set",
              "steps_per_epoch=2", "--set", "batch_size=32", "--set", "threads=1", "--set", "bf16=false",
              "--set", "eval_batch_size=400", "--set", "task=distillation", *DISTILLED]
    from_recipe = [*common, "--set", "task.teacher=recipe:digits", "--set", f"task.teacher_out={teacher_dir}",
                   "--set", 'task.teacher_set=["epochs=1", "steps_per_epoch=2"]']
    assert cli(["train", "--out", str(tmp_path / "a"), *from_recipe]) == 0
    assert "training the teacher first: vitkit train --recipe digits" in capsys.readouterr().err
    summary = json.loads((teacher_dir / "summary.json").read_text())
    assert summary["status"] == "done" and summary["recipe"] == "digits" and summary["steps"] == 2
    made = (teacher_dir / "best.safetensors").stat().st_mtime_ns
    assert cli(["train", "--out", str(tmp_path / "b"), *from_recipe]) == 0
    assert "teacher first" not in capsys.readouterr().err  # reused, not trained again
    assert (teacher_dir / "best.safetensors").stat().st_mtime_ns == made
    # the same run with the teacher file given directly: the same steps
    assert cli(["train", "--out", str(tmp_path / "c"), *common, "--set",
                f"task.teacher={teacher_dir / 'best.safetensors'}"]) == 0
    steps = [[json.loads(s)["loss"] for s in (tmp_path / r / "steps.jsonl").read_text().splitlines()] for r in "abc"]
    assert len(steps[0]) == 2 and steps[0] == steps[1] == steps[2]
    # a folder that holds another recipe's run is not taken for the teacher
    capsys.readouterr()
    assert cli(["train", "--out", str(tmp_path / "d"), *common, "--set", "task.teacher=recipe:fashion-mnist-resnet18",
                "--set", f"task.teacher_out={teacher_dir}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds a run of recipe 'digits'" in err and "\n" not in err


def test_the_teacher_logits_cache_reuses_each_image_and_resumes_exactly(tmp_path):
    """With fixed image variants (no random crop, erasing or mixing) the teacher runs once per image: a
    repeated image costs no teacher forward and gets the teacher's own logits; the cache is saved with the
    state, so a resumed run continues exactly; random crops switch it off."""
    from vitkit.training.recipes import Recipe
    from vitkit.training.state import load_state
    from vitkit.training.tasks import DistillationTask

    torch.manual_seed(0)
    teacher = vitkit.save_model(vitkit.create_model("resnet18", in_chans=1, img_size=8), tmp_path / "t.safetensors")
    args = {"teacher": str(teacher), "kind": "soft"}
    fixed = Recipe(task="distillation", task_args=args, crop="none", reprob=0.0, bf16=False,
                   model_args={"distilled": True, "class_token": True, "global_pool": "token"})
    student = vitkit.create_model("vit_pico_patch2_8", **fixed.model_args)
    task = DistillationTask(fixed, student, num_classes=10, device=torch.device("cpu"))
    seen = []
    task.teacher.register_forward_hook(lambda m, inp, out: seen.append(len(inp[0])))
    x, y = torch.randn(6, 1, 8, 8), torch.arange(6)
    task((x, y))
    with torch.no_grad():
        direct = task.teacher(x)
    assert seen == [6, 6]
    torch.testing.assert_close(task.teacher_logits(x), direct, rtol=1e-5, atol=1e-6)
    assert seen == [6, 6]  # all six from the cache
    task.teacher_logits(torch.cat([x[:3], torch.randn(2, 1, 8, 8)]))
    assert seen == [6, 6, 2] and len(task.cache) == 8  # only the two new images went through the teacher
    rrc = DistillationTask(fixed.replace(crop="rrc"), student, num_classes=10,
                           device=torch.device("cpu"))
    assert rrc.cache is None

    common = ["--data", "digits", "--model", "vit_pico_patch2_8", "--epochs", "2", "--quiet", "--set",
              "steps_per_epoch=3", "--set", "batch_size=32", "--set", "threads=1", "--set", "bf16=false",
              "--set", "crop=none", "--set", "reprob=0", "--set", "hflip=0.5", "--set", "task=distillation",
              "--set", f"task.teacher={teacher}", *DISTILLED]
    assert cli(["train", "--out", str(tmp_path / "straight"), *common]) == 0
    assert cli(["train", "--out", str(tmp_path / "split"), *common, "--stop-after-epochs", "1"]) == 0
    assert len(load_state(tmp_path / "split" / "state.safetensors")["task"]["_extra_state.teacher_cache_keys"]) == 96
    assert cli(["train", "--out", str(tmp_path / "split"), "--resume", "--quiet"]) == 0
    steps = [[json.loads(s)["loss"] for s in (tmp_path / r / "steps.jsonl").read_text().splitlines()]
             for r in ("straight", "split")]
    assert len(steps[0]) == 6 and steps[0] == steps[1]
    a = load_state(tmp_path / "straight" / "state.safetensors")["task"]
    b = load_state(tmp_path / "split" / "state.safetensors")["task"]
    keys = "_extra_state.teacher_cache_keys"
    assert torch.equal(a[keys], b[keys]) and 96 < len(a[keys]) <= 192
