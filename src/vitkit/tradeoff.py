"""One checkpoint's accuracy against its cost over the knobs it can turn at run time (`vitkit tradeoff`):
the input resolution (positions resampled), the patch size (FlexiViT's kernel resize, on models with the
`patch_resample` capability), token merging (ToMe's R, on ViTs) and a token budget (NaFlex: each image at its own
aspect ratio within N patches, on models with `native_aspect`). Every setting is loaded from the file itself, so
each starts from the checkpoint's own kernel and position table; each is scored on the same images, costed by the
closed form (GMACs, tokens: under a token budget the mean over the scored images at their own grids) and timed on
this machine on the same real images: all settings round-robin in one timing run (timing.paired_times), at batch 1
(latency, ms) and at `batch` (throughput, img/s; a token budget's batch is padded, and its time says so).

A setting chosen under a budget is stored in a copy of the checkpoint as its default inference settings
(provenance `inference_settings`), which `load_model` applies when the caller does not set those knobs.
"""
from __future__ import annotations

import contextlib
import logging
import statistics
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .api import INFERENCE_SETTINGS
from .errors import ConfigError

AXES = {"img": "img_size", "img_size": "img_size", "patch": "patch_size", "patch_size": "patch_size",
        "merge": "merge", "r": "merge", "tokens": "max_tokens", "max_tokens": "max_tokens"}


@dataclass(frozen=True)
class Setting:
    img_size: int
    patch_size: int
    merge: int = 0
    max_tokens: int = 0  # NaFlex: images at their own aspect ratio within this many patches (0: square crops)

    @property
    def label(self) -> str:
        return (f"{self.img_size}px p{self.patch_size}" + (f" r{self.merge}" if self.merge else "")
                + (f" <={self.max_tokens}t" if self.max_tokens else ""))

    def changes_from(self, base: Setting) -> dict[str, int]:
        """What `load_model` is told to load the checkpoint (at `base`) at this setting: the knobs that differ."""
        return {k: v for k, v in (("patch_size", self.patch_size), ("merge", self.merge), ("max_tokens", self.max_tokens))
                if v != getattr(base, k)}


def parse_grid(text: str) -> dict[str, list[int]]:
    """'img=40,56;patch=4,8;merge=0,8' -> {img_size: [40, 56], patch_size: [4, 8], merge: [0, 8]}."""
    axes: dict[str, list[int]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        key, eq, values = part.partition("=")
        axis = AXES.get(key.strip())
        try:
            numbers = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            numbers = []
        if not eq or axis is None or not numbers or min(numbers) < 0:
            raise ConfigError(f"--grid {text!r}: expected AXIS=N,N,... separated by ';' with AXIS one of img, patch, "
                              "merge, tokens (e.g. 'img=40,56;patch=4,8;merge=0,8;tokens=0,100')")
        axes[axis] = sorted(set(numbers))
    return axes


def knobs(model) -> dict[str, bool]:
    """Which knobs `model` can turn: every model its resolution; patch size and merging where it can."""
    capabilities = getattr(model, "capabilities", ())
    return {"img_size": True, "patch_size": "patch_resample" in capabilities,
            "merge": hasattr(model, "set_merge"),  # what api.set_merge asks
            "max_tokens": "native_aspect" in capabilities}  # and api.set_max_tokens


def native(model) -> Setting:
    cfg = model.cfg
    side = cfg.img_size[0] if isinstance(cfg.img_size, tuple | list) else int(cfg.img_size)
    patch = getattr(cfg, "patch_size", None)
    return Setting(int(side), int(patch[0] if isinstance(patch, tuple | list) else patch or 0), int(getattr(cfg, "merge", 0)),
                   int(model.preprocess.max_tokens))


def _multiple(value: float, of: int) -> int:
    return max(of, int(round(value / of)) * of) if of else int(round(value))


def default_grid(model) -> list[Setting]:
    """One knob at a time from the native point: the resolution at 1/2, 3/4 and 5/4 of it (multiples of the
    patch); with patch resizing, patches 1.5x and 2x at about the native resolution (fewer tokens for the same
    pixels); with merging, R removing about a quarter, a half and three quarters of the patch tokens over the
    depth (ToMe's clamp holds at most half per block); with a token budget, the native patch count and half of it,
    each image at its own aspect ratio."""
    n = native(model)
    can = knobs(model)
    grid = [n] + [Setting(_multiple(n.img_size * f, n.patch_size or 1), n.patch_size, 0) for f in (0.5, 0.75, 1.25)]
    if can["patch_size"]:
        for f in (1.5, 2):
            p = int(round(n.patch_size * f))
            grid.append(Setting(_multiple(n.img_size, p), p, 0))
    if can["merge"]:
        patches = (n.img_size // n.patch_size) ** 2
        depth = len(model.blocks)
        for f in (0.25, 0.5, 0.75):
            grid.append(Setting(n.img_size, n.patch_size, max(1, min(patches // 2, round(f * patches / depth)))))
    if can["max_tokens"] and not n.max_tokens:
        patches = (n.img_size // n.patch_size) ** 2
        grid += [Setting(n.img_size, n.patch_size, 0, max(1, round(patches * f))) for f in (1.0, 0.5)]
    return list(dict.fromkeys(grid))


def grid_from_axes(model, axes: dict[str, list[int]]) -> tuple[list[Setting], list[str]]:
    """The product of the given axes (the others at the native value) -> (valid settings, why each other one
    is not: a patch that does not divide the image, a knob the model cannot turn, too large an R)."""
    from .layers.tome import check_merge

    n, can = native(model), knobs(model)
    for axis in axes:
        if not can[axis]:
            raise ConfigError(f"--grid {axis}: this model cannot change its {axis.replace('_', ' ')} "
                              "(patch size: ViTs with a linear patch embedding; merge: ViTs with a position table; "
                              "tokens: ViTs without rotary or relative positions)")
    out, refused = [], []
    for img in axes.get("img_size", [n.img_size]):
        for patch in axes.get("patch_size", [n.patch_size]):
            for r in axes.get("merge", [n.merge]):
                for tokens in axes.get("max_tokens", [n.max_tokens]):
                    s = Setting(img, patch, r, tokens)
                    if patch and img % patch:
                        refused.append(f"{s.label}: {patch} does not divide {img}")
                        continue
                    if r and tokens:
                        refused.append(f"{s.label}: token merging and a token budget do not combine")
                        continue
                    if r:
                        try:
                            check_merge(r, (img // patch) ** 2)
                        except ConfigError as e:
                            refused.append(f"{s.label}: {e}")
                            continue
                    out.append(s)
    if not out:
        raise ConfigError("--grid leaves no setting to measure: " + "; ".join(refused))
    return out, refused


@contextlib.contextmanager
def quiet_loads() -> Iterator[None]:
    """Each setting's load says how it resampled positions and kernel; the table says it once per row."""
    logger = logging.getLogger("vitkit")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def load_at(path, setting: Setting, base: Setting):
    """The checkpoint loaded at `setting` (only the knobs that differ from its native `base` are passed)."""
    from .api import load_model

    with quiet_loads():
        return load_model(path, img_size=setting.img_size, **setting.changes_from(base)).eval()


def budget_cost(model, dataset, limit: int | None) -> tuple[float, float]:
    """(mean GMACs, mean tokens into the first block) of the scored images at their own grids under the model's
    token budget (closed form per grid; padding not counted: the timing shows what it costs)."""
    from collections import Counter

    from torchvision.transforms.v2 import functional as TF

    from .analysis.cost import model_cost
    from .layers.naflex import grid_for_budget

    pre = model.preprocess
    n = len(dataset) if limit is None else min(limit, len(dataset))
    grids = Counter(grid_for_budget(*TF.get_size(dataset[i][0]), pre.token_patch, pre.max_tokens) for i in range(n))
    macs = tokens = 0.0
    for (gh, gw), count in grids.items():
        cost = model_cost(model, img_size=(gh * pre.token_patch, gw * pre.token_patch))
        macs, tokens = macs + count * cost.macs_total, tokens + count * cost.tokens
    return macs / n / 1e9, tokens / n


def timing_input(model, dataset, b: int):
    """The first `b` images of `dataset` as the model takes them (its eval transform; padded under a token budget)."""
    from .data.transforms import eval_transform, stack_inputs

    tf = eval_transform(model.preprocess)
    return stack_inputs([tf(dataset[i % len(dataset)][0]) for i in range(b)])


def measure(path, settings: list[Setting], dataset, num_classes: int, *, batch: int = 8, batch_size: int = 256,
            limit: int | None = None, repeats: int = 7) -> list[dict[str, Any]]:
    """Each setting scored on `dataset` (the first `limit` images), costed and timed: rows of setting, top1,
    gmacs, tokens (into the first block) and tokens_out (out of the last), latency_ms (batch 1, median) and
    img_per_s (at `batch`)."""
    from .analysis.cost import model_cost
    from .api import load_model
    from .data.datasets import eval_loader
    from .latency import model_gmacs
    from .timing import paired_times
    from .training.evaluate import evaluate

    with quiet_loads():
        base = native(load_model(path))
    models, rows = {}, []
    for s in settings:
        model = load_at(path, s, base)
        res = evaluate(model, eval_loader(dataset, model.preprocess, batch_size=batch_size, limit=limit), num_classes,
                       torch.device("cpu"))
        row = {**asdict(s), "label": s.label, "top1": round(res["top1"], 2), "count": res["count"],
               "tokens": None, "tokens_out": None}
        if s.max_tokens:  # each image at its own grid: the mean over the scored images
            gmacs, tokens = budget_cost(model, dataset, limit)
            row |= {"gmacs": round(gmacs, 4), "gmacs_from": "closed form per image grid",
                    "tokens": round(tokens, 1), "tokens_out": round(tokens, 1)}
        else:
            gmacs, counted = model_gmacs(model)
            row |= {"gmacs": round(gmacs, 4), "gmacs_from": counted}
            if hasattr(getattr(model, "cfg", None), "merge"):
                cost = model_cost(model)
                row |= {"tokens": cost.tokens,
                        "tokens_out": cost.tokens_per_block[-1] if cost.tokens_per_block else cost.tokens}
        rows.append(row)
        models[s] = model
    for b, key in ((1, "latency_ms"), (batch, "img_per_s")):
        fns = {}
        for s, model in models.items():
            x = timing_input(model, dataset, b)  # real images: a token budget's batch padded as in use
            fns[s] = (lambda m, x: lambda: m(x))(model, x)
        with torch.inference_mode():
            times = paired_times(fns, warmup=2, repeats=repeats)
        for row, s in zip(rows, models):
            t = statistics.median(times[s])
            row[key] = round(1e3 * t, 3) if b == 1 else round(b / t, 1)
    return rows


def pareto(rows: list[dict[str, Any]], cost: str = "gmacs") -> list[dict[str, Any]]:
    """The rows no other row beats: none at least as accurate and at most as costly, better in one."""
    def beaten(r):
        return any(o is not r and o["top1"] >= r["top1"] and o[cost] <= r[cost]
                   and (o["top1"] > r["top1"] or o[cost] < r[cost]) for o in rows)
    return sorted((r for r in rows if not beaten(r)), key=lambda r: r[cost])


def choose(rows: list[dict[str, Any]], *, budget_gmacs: float | None = None,
           budget_ms: float | None = None) -> dict[str, Any]:
    """The most accurate row within the budget (ties: the cheaper); one line when nothing fits."""
    if (budget_gmacs is None) == (budget_ms is None):
        raise ConfigError("give one budget: --budget-gmacs G or --budget-ms T")
    key, limit, unit = ("gmacs", budget_gmacs, "GMACs") if budget_gmacs is not None else ("latency_ms", budget_ms, "ms")
    fits = [r for r in rows if r[key] <= limit]
    if not fits:
        cheapest = min(rows, key=lambda r: r[key])
        raise ConfigError(f"no setting fits {limit:g} {unit}: the cheapest measured is {cheapest['label']} at "
                          f"{cheapest[key]:g} {unit} (add smaller settings with --grid)")
    return max(fits, key=lambda r: (r["top1"], -r[key]))


def save_choice(path, row: dict[str, Any], out, how: dict[str, Any]) -> Path:
    """A copy of the checkpoint whose default inference settings are `row`'s setting: the weights as they are
    (the original kernel and table, so later changes still start from them), provenance `inference_settings`
    saying the setting, what chose it (`how`: the command, the budget, the data) and what it measured."""
    from .api import load_model, save_model

    with quiet_loads():
        model = load_model(path)
    chosen = Setting(row["img_size"], row["patch_size"], row["merge"], row.get("max_tokens", 0))
    changed = chosen.changes_from(native(model))  # what load_model is told
    measured = {k: row[k] for k in ("top1", "gmacs", "latency_ms", "img_per_s", "tokens", "tokens_out") if k in row}
    model.provenance[INFERENCE_SETTINGS] = {"img_size": row["img_size"], "label": row["label"], "overrides": changed,
                                            "measured": measured, **how}
    out = Path(out)
    save_model(model, out)
    return out


def write_plot(report: dict[str, Any], path) -> Path:
    """Top-1 against GMACs and against batch-1 latency, the Pareto front joined, the chosen setting ringed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from ._files import save_figure

    rows = report["rows"]
    fig = Figure(figsize=(10, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, key, xlabel in ((axes[0], "gmacs", "GMACs per image (closed form)"),
                            (axes[1], "latency_ms", "batch-1 latency (ms, median, this machine)")):
        knob = [("merge" if r["merge"] else "tokens" if r.get("max_tokens") else
                 "patch" if r["patch_size"] != report["native"]["patch_size"] else "resolution") for r in rows]
        for i, kind in enumerate(("resolution", "patch", "merge", "tokens")):
            pts = [r for r, k in zip(rows, knob) if k == kind]
            ax.scatter([r[key] for r in pts], [r["top1"] for r in pts], color=f"C{i}", label=kind, s=40)
        front = pareto(rows, key)
        ax.plot([r[key] for r in front], [r["top1"] for r in front], color="grey", lw=1, zorder=0)
        for r in rows:
            ax.annotate(r["label"], (r[key], r["top1"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        chosen = report.get("chosen")
        if chosen:
            ax.scatter([chosen[key]], [chosen["top1"]], s=160, facecolors="none", edgecolors="black")
        ax.set_xlabel(xlabel)
    axes[0].set_ylabel(f"top-1 % ({report['data']}, {report['count']} images)")
    axes[0].legend(fontsize=8, title="knob turned", title_fontsize=8)
    fig.suptitle(f"{report['checkpoint']}: accuracy vs cost, {report['machine']['cpu']} "
                 f"({report['machine']['threads']} threads), {report['date'][:10]}", fontsize=9)
    return save_figure(fig, path)
