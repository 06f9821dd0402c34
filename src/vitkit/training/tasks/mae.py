"""MAE pretraining as a training objective: the model is the ViT encoder (what the run saves, ready for
`--finetune`); the task owns the decoder (trained with it, kept in state.safetensors for --resume).
Labels are ignored, so any labelled set or image folder works."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import ConfigError
from ...models import require
from ...models.mae import MaeDecoder, mae_forward, reconstruct
from ...typed_config import JsonConfig
from .base import Task


@dataclass
class MaeOptions(JsonConfig):
    _what = "MAE option"

    mask_ratio: float = 0.75
    norm_pix_loss: bool = True
    decoder_dim: int = 128  # MAE's ImageNet decoder is 512 wide, 8 deep, 16 heads; small data needs less
    decoder_depth: int = 2
    decoder_heads: int = 4
    decoder_mlp_ratio: float = 4.0

    def __post_init__(self):
        if not 0 < self.mask_ratio < 1:
            raise ConfigError(f"task.mask_ratio must be in (0, 1), got {self.mask_ratio}")
        if self.decoder_dim % self.decoder_heads or self.decoder_dim % 4:
            raise ConfigError("task.decoder_dim must be divisible by task.decoder_heads and by 4")


class MaeTask(Task):
    """`--set task=mae [--set task.mask_ratio=0.75 --set task.decoder_dim=128 ...]` on a ViT."""

    every_parameter_used = False  # the encoder's classifier (and its pooling norm) get no gradient

    def __init__(self, recipe, model, **kw):
        super().__init__(recipe, model, **kw)
        require(self.model, "token_seam", "MAE pretraining")
        self.opts = o = MaeOptions.from_dict(recipe.task_args)
        m = self.model
        self.decoder = MaeDecoder(m.embed_dim, m.patch_embed.grid_size, m.cfg.patch_size, m.cfg.in_chans,
                                  m.num_prefix_tokens, o.decoder_dim, o.decoder_depth, o.decoder_heads,
                                  o.decoder_mlp_ratio, m.cfg.norm_eps).to(self.device)

    def forward(self, batch) -> dict[str, Any]:
        x = batch[0]
        with self.autocast():
            out = mae_forward(self.model, self.decoder, x, self.opts.mask_ratio, norm_pix=self.opts.norm_pix_loss)
        return {"loss": out["loss"], "batch_size": len(x)}

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader) -> dict[str, Any]:
        """Reconstruction loss on the eval split with the same masks every epoch (noise seeded by batch)."""
        total, n = 0.0, 0
        gen = torch.Generator().manual_seed(0)
        for batch in loader:
            x = batch[0].to(self.device)
            gh, gw = model.patch_embed.grid_for(*x.shape[-2:])
            noise = torch.rand(len(x), gh * gw, generator=gen).to(self.device)
            with self.autocast():
                out = mae_forward(model, self.decoder, x, self.opts.mask_ratio, noise, self.opts.norm_pix_loss)
            total += out["loss"].item() * len(x)
            n += len(x)
        loss = total / max(n, 1)
        return {"loss": loss, "score": -loss}

    @torch.no_grad()
    def figures(self, model: nn.Module, dataset, folder) -> dict[str, Any]:
        """Original / masked / reconstructed for the first images of `dataset`, with fixed masks (the loop calls
        it in eval mode)."""
        from ..report import plot_reconstructions

        x = torch.stack([dataset[i][0] for i in range(min(6, len(dataset)))]).to(self.device)
        gh, gw = model.patch_embed.grid_for(*x.shape[-2:])
        noise = torch.rand(len(x), gh * gw, generator=torch.Generator().manual_seed(0)).to(self.device)
        out = mae_forward(model, self.decoder, x, self.opts.mask_ratio, noise, self.opts.norm_pix_loss)
        masked, filled = reconstruct(out["pred"], x, out["mask"], self.decoder.patch_size, self.opts.norm_pix_loss)
        pre = model.preprocess
        path = plot_reconstructions([x, masked, filled], pre.mean, pre.std, folder / "reconstructions.png",
                                    f"MAE, {100 * self.opts.mask_ratio:.0f}% of the patches hidden")
        return {"reconstructions": path}

    def describe(self, metrics: dict[str, Any], raw: dict[str, Any] | None = None) -> str:
        extra = f" (without EMA {raw['loss']:.4f})" if raw else ""
        return f"reconstruction loss {metrics['loss']:.4f}{extra}"
