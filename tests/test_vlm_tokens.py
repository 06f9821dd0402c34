"""`vitkit cost MODEL --vlm`: an image's price in LLM tokens, checked against the figures the models publish."""
from __future__ import annotations

import json

import pytest

from vitkit.analysis.vlm import anyres_tiles, internvl_tiles, merged, vlm_report
from vitkit.cli.main import main as cli
from vitkit.errors import ConfigError


def _tokens(model: str, image=None, **kw) -> dict[str, int]:
    return {s["scheme"].split(" (")[0]: s["tokens"] for s in vlm_report(model, image_hw=image, **kw)["schemes"]}


def test_published_token_counts():
    # LLaVA-1.5: CLIP ViT-L/14 at 336 px feeds 576 tokens; LLaVA-NeXT's anyres at most 5 x 576 = 2,880
    assert _tokens("vit_large_patch14_clip_336")["one token per patch"] == 576
    assert _tokens("vit_large_patch14_clip_336", (672, 672))["anyres"] == 2880
    # SigLIP so400m/14: 27 x 27 = 729 at 378 px; PaliGemma-224's 256 at 224 px
    assert _tokens("vit_so400m_patch14_siglip_378")["one token per patch"] == 729
    assert _tokens("vit_so400m_patch14_siglip_224")["one token per patch"] == 256
    # InternVL 1.5/2: InternViT-300M/14 at 448 px, pixel shuffle 0.5 -> 256 tokens per tile
    t = _tokens("vit_intern300m_patch14_448")
    assert t["pixel shuffle 0.5"] == 256 and t["dynamic tiling"] == 256  # a one-tile image has no thumbnail
    # Qwen2-VL: 14 px patches, 2x2 merge -> H x W / 28^2 tokens (448 x 448: 256)
    assert _tokens("vit_so400m_patch14_siglip_224", img_size=448)["2x2 merge"] == 448 * 448 // 28 ** 2


def test_tiling_grids_follow_the_reference_rules():
    # InternVL: a 1920x1080 photo with at most 12 tiles -> 2 rows x 4 cols (+ a thumbnail): 9 x 256 tokens
    assert internvl_tiles((1080, 1920), 448, 12) == (2, 4)
    assert _tokens("vit_intern300m_patch14_448", (1080, 1920))["dynamic tiling"] == 9 * 256
    assert internvl_tiles((448, 448), 448, 12) == (1, 1)
    assert internvl_tiles((448, 896), 448, 6) == (1, 2)  # 2:1 -> one row of two tiles
    # LLaVA-NeXT: a wide image takes the 1x2 grid, a tall one 2x1, a large square 2x2
    assert anyres_tiles((336, 1000), 336) == (1, 3) and anyres_tiles((1000, 336), 336) == (3, 1)
    assert anyres_tiles((1000, 1000), 336) == (2, 2)
    assert merged((27, 27), 2) == 14 * 14  # an odd grid's edge blocks are padded


def test_command_line_table_json_and_bad_input(capsys):
    assert cli(["cost", "vit_large_patch14_clip_336", "--vlm", "--image-size", "672x672", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["grid"] == [24, 24] and out["image_size"] == [672, 672]
    assert [s["tokens"] for s in out["schemes"]][0] == 576
    for name, says in (("swin_tiny_patch4_window7_224", "counts patch tokens"), ("resnet18", "no closed-form")):
        assert cli(["cost", name, "--vlm"]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0], err
    with pytest.raises(ConfigError, match="max tiles"):
        internvl_tiles((448, 448), 448, 0)
