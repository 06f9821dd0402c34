"""Run-folder figures and the human-readable report. Figures are drawn with matplotlib's object API
(a bare `Figure`, saved to PNG through the Agg renderer; no pyplot), so no display is needed and the
process's backend is left alone."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def plot_curves(history: list[dict[str, Any]], path: Path) -> None:
    from matplotlib.figure import Figure

    epochs = [h["epoch"] for h in history]
    fig = Figure(figsize=(10, 4))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.plot(epochs, [h["train_loss"] for h in history], label="train loss")
    ax1.plot(epochs, [h["eval_loss"] for h in history], label=f"{history[-1]['eval_split']} loss")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("loss")
    ax1.legend()
    ax2.plot(epochs, [h["eval_top1"] for h in history], label=f"{history[-1]['eval_split']} top-1")
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


def write_report(run: Path, summary: dict[str, Any]) -> Path:
    f = summary["final"]
    lines = [
        f"# vitkit run: {run.name}", "",
        f"- recipe: `{summary['recipe']}`, model `{summary['model']}`, data `{summary['data']}`",
        f"- command: `{summary['command']}`",
        f"- epochs: {summary['epochs']}, wall time {summary['wall_time_s']:.0f} s, {summary['img_per_s']:.0f} img/s",
        f"- final {f['split']} top-1 **{f['top1']:.2f}%**, top-5 {f['top5']:.2f}%",
        f"- best {summary['best']['split']} top-1 {summary['best']['top1']:.2f}% (epoch {summary['best']['epoch']})",
    ]
    if summary.get("skipped_images"):
        lines.append(f"- skipped {summary['skipped_images']} unreadable image(s): see config.json data.skipped")
    lines += ["", "![curves](curves.png)", "", "![confusion](confusion.png)", ""]
    path = run / "report.md"
    path.write_text("\n".join(lines))
    return path
