"""MAE: masking, patch order and loss as MAE defines them, parity with transformers' ViTMAEForPreTraining
(same weights, same noise: same loss, prediction and mask), and `--task mae` through the real trainer,
then fine-tuning the encoder it saved."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import ViTMAEConfig, ViTMAEForPreTraining

import vitkit
from test_import_timm import perturb
from vitkit.cli.main import main as cli
from vitkit.models.mae import (
    MaeDecoder,
    mae_forward,
    patchify,
    random_masking,
    reconstruct,
    reconstruction_loss,
    unpatchify,
)
from vitkit.weights.importers.mae import mae_decoder_state


def test_masking_keeps_the_lowest_noise_and_restores_order():
    noise = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.4, 0.6]])
    keep, mask, restore = random_masking(2, 4, 0.5, noise)
    assert keep.tolist() == [[1, 3], [0, 2]]
    assert mask.tolist() == [[1, 0, 1, 0], [0, 1, 0, 1]]  # 1 = hidden, in the original order
    shuffle = torch.argsort(noise, dim=1)
    assert torch.equal(torch.gather(shuffle, 1, restore), torch.arange(4).expand(2, -1))
    _, mask, _ = random_masking(3, 196, 0.75)
    assert (mask.sum(1) == 196 - 49).all()


def test_patchify_is_mae_order_and_inverts():
    x = torch.arange(2 * 3 * 4 * 6, dtype=torch.float).reshape(2, 3, 4, 6)
    p = patchify(x, 2)  # [2, 6, 12]
    assert p.shape == (2, 6, 12)
    # first patch, first pixel: the 3 channels of x[:, :, 0, 0] next to each other (channel last)
    assert p[0, 0, :3].tolist() == x[0, :, 0, 0].tolist() and p[0, 0, 3:6].tolist() == x[0, :, 0, 1].tolist()
    assert torch.equal(unpatchify(p, 2, (2, 3), 3), x)


def test_loss_counts_hidden_patches_only():
    images = torch.randn(2, 1, 4, 4)
    target = patchify(images, 2)
    mask = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1]])
    pred = target.clone()
    pred[:, 1:3] += 100.0  # wrong only where the patches were visible
    assert reconstruction_loss(pred, images, mask, 2, norm_pix=False) == 0
    pred[0, 0] += 1.0
    assert reconstruction_loss(pred, images, mask, 2, norm_pix=False) == pytest.approx(0.5)  # (1 + 0) / 2 patches


def test_reconstruction_pastes_visible_patches_and_undoes_norm_pix():
    images = torch.randn(2, 3, 8, 8)
    _, mask, _ = random_masking(2, 16, 0.75, torch.rand(2, 16, generator=torch.Generator().manual_seed(0)))
    target = patchify(images, 2)
    perfect = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6) ** 0.5
    masked, filled = reconstruct(perfect, images, mask, 2, norm_pix=True)
    torch.testing.assert_close(filled, images, atol=1e-5, rtol=1e-5)  # a perfect norm-pix guess gives the image back
    hidden = unpatchify(mask[..., None].expand(-1, -1, 12), 2, (4, 4), 3).bool()
    assert (masked[hidden] == 0).all() and torch.equal(masked[~hidden], images[~hidden])
    _, wrong = reconstruct(torch.zeros_like(perfect), images, mask, 2, norm_pix=False)
    assert torch.equal(wrong[~hidden], images[~hidden]) and (wrong[hidden] == 0).all()


@pytest.mark.parametrize("norm_pix", [True, False])
def test_parity_with_transformers_vitmae(norm_pix, tmp_path):
    cfg = ViTMAEConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=2,
                       decoder_num_attention_heads=4, decoder_intermediate_size=64, layer_norm_eps=1e-6,
                       norm_pix_loss=norm_pix, mask_ratio=0.75)
    peer = ViTMAEForPreTraining(cfg)
    peer.decoder.initialize_weights(16)  # transformers 5 fills the fixed table lazily
    hf_table = peer.decoder.decoder_pos_embed.detach().clone()  # HF's fixed table, before the perturbation
    assert hf_table.abs().sum() > 1
    peer = perturb(peer)
    peer.save_pretrained(tmp_path / "mae", safe_serialization=True)
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    noise = torch.rand(3, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = peer(pixel_values=x, noise=noise)
    assert ref.logits.std() > 1e-3

    # the pieces by hand (the whole model in one call: tests/test_load_whole.py): the folder's encoder, a decoder
    encoder = vitkit.load_model(tmp_path / "mae", tower="image").eval()
    decoder = MaeDecoder(64, (4, 4), 8, 3, 1, decoder_dim=32, depth=2, num_heads=4, mlp_ratio=2.0).eval()
    assert torch.allclose(decoder.decoder_pos_embed, hf_table, atol=1e-6)  # the same fixed sin-cos table
    decoder.load_state_dict(mae_decoder_state(load_file(str(tmp_path / "mae" / "model.safetensors"))))
    with torch.no_grad():
        out = mae_forward(encoder, decoder, x, 0.75, noise, norm_pix=norm_pix)
    assert torch.equal(out["mask"], ref.mask) and torch.equal(out["ids_restore"], ref.ids_restore)
    assert (out["pred"] - ref.logits).abs().max() <= 1e-4
    assert abs(out["loss"].item() - ref.loss.item()) <= 1e-4


def test_mae_task_trains_the_encoder_and_fine_tunes_from_it(tmp_path, capsys):
    run = tmp_path / "mae"
    args = ["train", "--data", "digits", "--model", "vit_pico_patch2_8", "--out", str(run), "--epochs", "2",
            "--quiet", "--set", "task=mae", "--set", "steps_per_epoch=4", "--set", "batch_size=32",
            "--set", "threads=1", "--set", "bf16=false", "--set", "task.decoder_dim=32",
            "--set", "task.decoder_depth=1"]
    assert cli(args) == 0
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(m["eval_loss"] > 0 for m in metrics) and "eval_top1" not in metrics[0]
    assert metrics[1]["train_loss"] < metrics[0]["train_loss"]  # it learns something in 8 steps
    report = (run / "report.md").read_text()
    assert "![reconstructions](reconstructions.png)" in report and (run / "reconstructions.png").stat().st_size > 0
    encoder = vitkit.load_model(run / "best.safetensors")
    assert encoder.family == "vit" and not any(k.startswith("decoder") for k in encoder.state_dict())
    from vitkit.training.state import load_state

    assert any(k.startswith("decoder.") for k in load_state(run / "state.safetensors")["task"])
    # the saved encoder fine-tunes as any checkpoint does
    assert cli(["train", "--finetune", str(run / "best.safetensors"), "--data", "digits", "--out",
                str(tmp_path / "ft"), "--epochs", "1", "--quiet", "--set", "steps_per_epoch=2",
                "--set", "threads=1", "--set", "bf16=false"]) == 0
    start = encoder.state_dict()["blocks.0.attn.qkv.weight"]
    tuned = vitkit.load_model(tmp_path / "ft" / "last.safetensors").state_dict()["blocks.0.attn.qkv.weight"]
    assert (tuned - start).abs().max() < 0.05  # started from the MAE encoder, not from scratch


def test_mae_options_are_checked(tmp_path, capsys):
    assert cli(["train", "--data", "digits", "--out", str(tmp_path / "x"), "--set", "task=mae",
                "--set", "task.mask_ratio=1.5"]) == 2
    assert "task.mask_ratio must be in (0, 1)" in capsys.readouterr().err
    assert cli(["train", "--data", "digits", "--out", str(tmp_path / "y"), "--set", "task=mae",
                "--set", "task.decoder_width=3"]) == 2
    assert "unknown MAE option field" in capsys.readouterr().err


def _step_losses(run):
    return [json.loads(s)["loss"] for s in (run / "steps.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("task", ["mae", "distillation"])
def test_resume_after_an_epoch_equals_an_uninterrupted_run(task, tmp_path):
    """Each objective keeps what it needs in state.safetensors (the MAE decoder; the distillation teacher
    is re-read from its file), so stopping after an epoch and resuming reproduces the same steps."""
    common = ["--data", "digits", "--model", "vit_pico_patch2_8", "--epochs", "2", "--quiet", "--set", f"task={task}",
              "--set", "steps_per_epoch=3", "--set", "batch_size=32", "--set", "threads=1", "--set", "bf16=false",
              "--set", "eval_batch_size=400"]
    if task == "mae":
        common += ["--set", "task.decoder_dim=32", "--set", "task.decoder_depth=1"]
    else:
        teacher = vitkit.save_model(vitkit.create_model("resnet18", in_chans=1, img_size=8), tmp_path / "t.safetensors")
        common += ["--set", f"task.teacher={teacher}", "--set", "task.kind=soft", "--set", "model.distilled=true",
                   "--set", "model.class_token=true", "--set", "model.global_pool=token"]
    assert cli(["train", "--out", str(tmp_path / "straight"), *common]) == 0
    assert cli(["train", "--out", str(tmp_path / "split"), *common, "--stop-after-epochs", "1"]) == 0
    assert cli(["train", "--out", str(tmp_path / "split"), "--resume", "--quiet"]) == 0
    a, b = _step_losses(tmp_path / "straight"), _step_losses(tmp_path / "split")
    assert len(a) == 6 and a == pytest.approx(b, rel=1e-6)
    wa = load_file(str(tmp_path / "straight" / "last.safetensors"))
    wb = load_file(str(tmp_path / "split" / "last.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6, msg=k)


def test_mae_runs_under_torchrun(tmp_path):
    """The classifier takes no part in MAE: DDP must not wait for its gradients (find_unused_parameters)."""
    import os
    import subprocess
    import sys

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")
    args = ["--data", "digits", "--model", "vit_pico_patch2_8", "--epochs", "1", "--quiet", "--set", "task=mae",
            "--set", "steps_per_epoch=2", "--set", "batch_size=16", "--set", "threads=1", "--set", "bf16=false",
            "--set", "task.decoder_dim=32", "--set", "task.decoder_depth=1"]
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "vitkit", "train", "--out", str(tmp_path / "two"), *args],
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["final"]["loss"] > 0
