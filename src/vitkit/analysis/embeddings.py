"""What the embedding layers learned (ViT paper, Fig. 7 left and centre).

- Position embeddings: cosine similarity between the position vector of every patch and all others,
  one small grid per patch (learned tables show rows/columns and locality; fixed sin-cos tables are
  shown too but marked as not learned).
- Patch-embedding filters: the first principal components of the flattened patch filters, as images.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def pos_embed_similarity(model) -> torch.Tensor | None:
    """[Gh, Gw, Gh, Gw] cosine similarity of the patch rows of the stored position table
    (prefix rows dropped); None when the model has no position embedding."""
    if model.pos_embed is None:
        return None
    table = model.pos_embed.detach()[0, model._pos_prefix:].double()  # [N, D]
    gh, gw = model.patch_embed.grid_size
    unit = F.normalize(table, dim=-1)
    return (unit @ unit.T).reshape(gh, gw, gh, gw).float()


def patch_filter_components(model, k: int = 28) -> tuple[torch.Tensor, torch.Tensor]:
    """First `k` principal components of the patch-embedding filters.

    The conv weight [D, C, Ph, Pw] is D samples of a C*Ph*Pw vector; after centring, the right
    singular vectors are the components. Returns components [k, C, Ph, Pw] (unit norm, sign fixed so
    the largest entry is positive) and the explained variance ratio [k].
    """
    w = model.patch_embed.proj.weight.detach().double()  # [D, C, Ph, Pw]
    D, shape = w.shape[0], w.shape[1:]
    flat = w.reshape(D, -1)
    flat = flat - flat.mean(dim=0, keepdim=True)
    _, s, vt = torch.linalg.svd(flat, full_matrices=False)  # vt [r, C*Ph*Pw]
    k = min(k, vt.shape[0])
    comps = vt[:k]
    sign = torch.sign(comps.gather(1, comps.abs().argmax(dim=1, keepdim=True)))  # SVD signs are arbitrary
    comps = comps * sign
    var = s**2
    return comps.reshape(k, *shape).float(), (var[:k] / var.sum()).float()
