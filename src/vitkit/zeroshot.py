"""Zero-shot classification with a CLIP pair (Radford et al. 2021): classes named in words, no training.

Each class name fills a set of prompt templates ("a photo of a {}."); the text tower embeds every prompt, the
L2-normalised embeddings of one class are averaged and re-normalised (prompt ensembling), and an image's logits
are exp(logit_scale) * cos(image embedding, class embedding); probabilities are their softmax. That is open_clip's
`build_zero_shot_classifier` and CLIP's evaluation. Templates: `imagenet` (OpenAI's 80), `simple`
("a photo of a {}."), or a text file with one template per line.

`load_clip` is `vitkit.load_model` of a CLIP pair (a vitkit file of the `clip` family, an OpenAI / open_clip
checkpoint with both towers, a registered name with a pretrained tag such as `clip_vit_base_patch32.openai`:
open_clip's file from the Hugging Face hub cache), refused in one line when the file is not one.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .errors import CheckpointError, ConfigError
from .models.protocol import require

TEMPLATE_FILE = Path(__file__).resolve().parent / "assets" / "clip_imagenet_templates.txt"
SIMPLE_TEMPLATES = ("a photo of a {}.",)
_PAIR = "encode_text"  # the capability of a model with a text tower (models/protocol.py)


# ---------------------------------------------------------------------------- loading a pair
def load_clip(source: str | os.PathLike | dict, *, act: str | None = None, text_heads: int | None = None,
              vision_heads: int | None = None, device: str | torch.device = "cpu", **overrides) -> nn.Module:
    """A CLIP pair (ClipModel) from a file, a folder, a `name.tag`, or a state dict already read.

    `act`, `text_heads`, `vision_heads` apply to foreign checkpoints, which do not record them (OpenAI's:
    QuickGELU and 64-wide heads, what is assumed; open_clip's LAION/DataComp weights: act="gelu"); a vitkit
    file states its own. `overrides` change the config as it loads (e.g. img_size=336 resamples the position
    table)."""
    from .api import load_model

    if isinstance(source, dict):
        from .weights.convert import unwrap
        from .weights.importers.clip_text import check_clip_pair

        check_clip_pair(unwrap(source))  # why a dict is no pair, in the pair's own terms
    if not _states_its_config(source):
        stated = {"act": act, "text_heads": text_heads, "num_heads": vision_heads}
        overrides = {k: v for k, v in stated.items() if v is not None} | overrides
    model = load_model(source, device=device, **overrides)
    if _PAIR not in model.capabilities:
        tower_only = model.provenance.get("imported_from") in ("clip", "open_clip-timm")
        why = ("the image tower only (no token_embedding / text_projection): zero-shot needs the text tower too"
               if tower_only else f"a {model.family} model")
        where = "the state dict" if isinstance(source, dict) else source
        raise CheckpointError(f"{where} is not a CLIP pair (image and text towers), it holds {why}; zero-shot "
                              "needs a clip-family checkpoint or an OpenAI / open_clip file with both towers")
    return model


def _states_its_config(source) -> bool:
    """A vitkit file or a registered name: the activation and head counts are known, nothing is assumed."""
    from .api import pretrained_name
    from .weights.io import parse_vitkit_meta, read_safetensors_meta, resolve_path

    if isinstance(source, dict):
        return False
    if pretrained_name(source) is not None:
        return True
    p = resolve_path(source)
    return p.is_file() and p.suffix.lower() == ".safetensors" and parse_vitkit_meta(read_safetensors_meta(p), p) is not None


# ---------------------------------------------------------------------------- prompts
def load_templates(spec: str | Sequence[str] = "imagenet") -> list[str]:
    """`imagenet` (OpenAI's 80), `simple` ("a photo of a {}."), a file (one template per line, `#` comments and
    blank lines skipped), or a list of templates. Each template holds exactly one `{}`."""
    if not isinstance(spec, str):
        templates = [str(t) for t in spec]
        where = "the templates"
    elif spec == "imagenet":
        templates, where = TEMPLATE_FILE.read_text(encoding="utf-8").splitlines(), "imagenet"
    elif spec == "simple":
        templates, where = list(SIMPLE_TEMPLATES), "simple"
    else:
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"--templates {spec}: not imagenet, simple or a text file of templates")
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read the templates ({type(e).__name__})") from None
        templates, where = text.splitlines(), str(path)
    templates = [t.strip() for t in templates if t.strip() and not t.lstrip().startswith("#")]
    if not templates:
        raise ConfigError(f"{where}: no templates")
    bad = [t for t in templates if t.count("{}") != 1]
    if bad:
        raise ConfigError(f"{where}: every template needs exactly one {{}} where the class name goes; "
                          f"this one has {bad[0].count('{}')}: {bad[0]!r}")
    return templates


def parse_labels(text: str | Sequence[str]) -> list[str]:
    """'cat, dog,bird' (or a file with one label per line, or a list) -> ['cat', 'dog', 'bird']."""
    if isinstance(text, str):
        path = Path(text)
        items = path.read_text(encoding="utf-8").splitlines() if "," not in text and path.is_file() else text.split(",")
    else:
        items = list(text)
    labels = [str(t).strip() for t in items if str(t).strip()]
    if not labels:
        raise ConfigError("no class labels: give them as --labels \"cat,dog,...\" (or a file, one per line)")
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    if dupes:
        raise ConfigError(f"class labels given twice: {', '.join(dupes)}")
    return labels


# ---------------------------------------------------------------------------- the classifier
def _check_pair(model) -> None:
    require(model, _PAIR, "zero-shot")


@torch.no_grad()
def text_features(model, texts: Sequence[str], batch_size: int = 256) -> torch.Tensor:
    """L2-normalised text embeddings [N, E] (float32, on the model's device)."""
    from .text import default_tokenizer

    _check_pair(model)
    tok = default_tokenizer()
    device = model.logit_scale.device
    was = model.training
    model.eval()
    try:
        out = [model.encode_text(tok(list(texts[i:i + batch_size]), model.cfg.context_length).to(device)).float()
               for i in range(0, len(texts), batch_size)]
    finally:
        model.train(was)
    return F.normalize(torch.cat(out), dim=-1) if out else torch.zeros(0, model.embed_dim, device=device)


@torch.no_grad()
def build_classifier(model, labels: Sequence[str], templates: str | Sequence[str] = "imagenet") -> torch.Tensor:
    """Class embeddings [C, E]: for each label, the mean of its normalised template embeddings, re-normalised."""
    labels, templates = parse_labels(labels), load_templates(templates)
    prompts = [t.replace("{}", label) for label in labels for t in templates]  # label-major: [C * T]
    emb = text_features(model, prompts).reshape(len(labels), len(templates), -1)  # [C, T, E]
    return F.normalize(emb.mean(dim=1), dim=-1)  # [C, E]


@torch.no_grad()
def zeroshot_predict(model, images: torch.Tensor, classifier: torch.Tensor) -> torch.Tensor:
    """Probabilities [N, C] for preprocessed images [N, C_in, H, W]: softmax(exp(logit_scale) * cos)."""
    _check_pair(model)
    was = model.training
    model.eval()
    try:
        img = model.encode_image(images.to(model.logit_scale.device), normalize=True).float()  # [N, E]
    finally:
        model.train(was)
    logits = model.logit_scale.exp().float() * img @ classifier.to(img).t()  # [N, C]
    return logits.softmax(dim=-1)


def attach_classifier(model, labels: Sequence[str], templates: str | Sequence[str] = "imagenet") -> nn.Module:
    """Give `model` the zero-shot classifier for `labels` as its head (and the labels as its class names), so
    everything that runs a classifier (predict, eval, export, serve) runs it. Returns the model."""
    labels = parse_labels(labels)
    model.set_classifier(build_classifier(model, labels, templates), labels)
    model.provenance["zeroshot"] = {"templates": templates if isinstance(templates, str) else "custom",
                                    "num_templates": len(load_templates(templates))}
    return model
