"""Run-folder figures and the human-readable report. Figures are drawn with matplotlib's object API
(a bare `Figure`, saved to PNG through the Agg renderer; no pyplot), so no display is needed and the
process's backend is left alone."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def plot_curves(history: list[dict[str, Any]], path: Path) -> None:
    """Train and eval loss per epoch; for a classifier also the eval top-1 (and without EMA)."""
    from matplotlib.figure import Figure

    epochs = [h["epoch"] for h in history]
    split = history[-1]["eval_split"]
    classifier = "eval_top1" in history[-1]
    fig = Figure(figsize=(10 if classifier else 5, 4))
    axes = fig.subplots(1, 2 if classifier else 1)
    ax1 = axes[0] if classifier else axes
    ax1.plot(epochs, [h["train_loss"] for h in history], label="train loss")
    ax1.plot(epochs, [h["eval_loss"] for h in history], label=f"{split} loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("loss")
    ax1.legend()
    if classifier:
        ax2 = axes[1]
        ax2.plot(epochs, [h["eval_top1"] for h in history], label=f"{split} top-1")
        if any("raw_top1" in h for h in history):
            ax2.plot(epochs, [h.get("raw_top1") for h in history], "--", label="without EMA")
        ax2.set_xlabel("epoch")
        ax2.set_ylabel("accuracy (%)")
        ax2.legend()
        ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_confusion(confusion: torch.Tensor, class_names: list[str], path: Path, title: str) -> None:
    from matplotlib.figure import Figure

    k = len(class_names)
    size = min(4 + 0.5 * k, 20)
    fig = Figure(figsize=(size, size))
    ax = fig.subplots()
    ax.imshow(confusion.numpy(), cmap="Blues")
    ax.set_xticks(range(k), class_names, rotation=90 if k > 10 or max(map(len, class_names)) > 3 else 0)
    ax.set_yticks(range(k), class_names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    if k <= 20:
        thresh = confusion.max().item() / 2
        for i in range(k):
            for j in range(k):
                v = int(confusion[i, j])
                ax.text(j, i, str(v), ha="center", va="center", fontsize=8, color="white" if v > thresh else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def plot_reconstructions(rows: list[torch.Tensor], mean, std, path: Path, title: str) -> Path:
    """Columns of images: original, masked, reconstructed (each [B, C, H, W], normalised with mean/std)."""
    from matplotlib.figure import Figure

    labels = ("original", "masked", "reconstruction")
    n = rows[0].shape[0]
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    fig = Figure(figsize=(2 * len(rows), 2 * n))
    axes = fig.subplots(n, len(rows), squeeze=False)
    for j, imgs in enumerate(rows):
        pixels = (imgs.detach().float().cpu() * s + m).clamp(0, 1)  # [B, C, H, W] in [0, 1]
        for i in range(n):
            ax = axes[i][j]
            img = pixels[i].permute(1, 2, 0).numpy()
            ax.imshow(img[..., 0] if img.shape[-1] == 1 else img, cmap="gray" if img.shape[-1] == 1 else None,
                      vmin=0, vmax=1, interpolation="nearest")
            ax.set_axis_off()
            if i == 0:
                ax.set_title(labels[j] if j < len(labels) else "", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _metrics(d: dict[str, Any]) -> str:
    """Top-1/top-5 for a classifier; otherwise the task's own numbers (an MAE reports its loss)."""
    if "top1" in d:
        return f"top-1 **{d['top1']:.2f}%**, top-5 {d['top5']:.2f}%"
    return ", ".join(f"{k} {v:.4g}" for k, v in d.items() if isinstance(v, (int, float)) and k not in ("epoch",))


def write_report(run: Path, summary: dict[str, Any], figures: dict[str, Path] | None = None) -> Path:
    from .._files import atomic_write_text
    from .console import count

    f, best = summary["final"], summary["best"]
    lines = [
        f"# vitkit run: {run.name}", "",
        f"- recipe: `{summary['recipe']}`, model `{summary['model']}`, data `{summary['data']}`",
        f"- command: `{summary['command']}`",
        f"- epochs: {summary['epochs']}, wall time {summary['wall_time_s']:.0f} s, {summary['img_per_s']:.0f} img/s",
        f"- final {f['split']} {_metrics(f)}",
        f"- best {best['split']} {_metrics(best).replace('**', '')} (epoch {best['epoch']})",
    ]
    if summary.get("skipped_images"):
        lines.append(f"- skipped {count(summary['skipped_images'], 'unreadable image')}: see config.json data.skipped")
    lines += ["", "![curves](curves.png)", ""]
    if (run / "confusion.png").exists():
        lines += ["![confusion](confusion.png)", ""]
    for title, png in (figures or {}).items():
        lines += [f"![{title}]({Path(png).name})", ""]
    path = run / "report.md"
    atomic_write_text(path, "\n".join(lines))
    return path
