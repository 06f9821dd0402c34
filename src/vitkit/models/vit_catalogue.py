"""timm's ViT catalogue, by timm's names: each name's architecture, preprocessing and published weights.

Read off timm 1.0.31 (the arguments of each `vit_*` / `deit*` model function in vision_transformer.py, deit.py
and eva.py, and its default pretrained config) and checked against timm itself by tests/test_catalogue.py: the
same parameter count at full size and the same outputs for the same weights. vit_variants.py registers these;
names that need a block vitkit does not have are in REFUSED with the reason (docs/catalogue.md lists both).

Each entry: (ViTConfig fields that differ from the defaults, preprocessing "stats crop_pct interpolation",
pretrained tags with the default one first). A tag's weights are timm's hub repo `timm/{name}.{tag}`, except
for the `*_clip_quickgelu_*` names, whose weights timm keeps under the name without `_quickgelu`.
"""
from __future__ import annotations

from .config import CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD

STATS = {
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
    "inception": (INCEPTION_MEAN, INCEPTION_STD),
    "clip": (CLIP_MEAN, CLIP_STD),
    "raw": ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),  # pixels in [0, 1] as they are (TIPSv2, MIIL)
}

CATALOGUE: dict[str, tuple[dict, str, str]] = {
    "deit3_base_patch16_224": (
        dict(prefix_pos=False, init_values=1e-06),
        "imagenet 0.9 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit3_base_patch16_384": (
        dict(img_size=384, prefix_pos=False, init_values=1e-06),
        "imagenet 1.0 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit3_huge_patch14_224": (
        dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, prefix_pos=False, init_values=1e-06),
        "imagenet 0.9 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit3_large_patch16_224": (
        dict(embed_dim=1024, depth=24, num_heads=16, prefix_pos=False, init_values=1e-06),
        "imagenet 0.9 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit3_large_patch16_384": (
        dict(img_size=384, embed_dim=1024, depth=24, num_heads=16, prefix_pos=False, init_values=1e-06),
        "imagenet 1.0 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit3_medium_patch16_224": (
        dict(embed_dim=512, num_heads=8, prefix_pos=False, init_values=1e-06),
        "imagenet 0.9 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit3_small_patch16_224": (
        dict(embed_dim=384, num_heads=6, prefix_pos=False, init_values=1e-06),
        "imagenet 0.9 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit3_small_patch16_384": (
        dict(img_size=384, embed_dim=384, num_heads=6, prefix_pos=False, init_values=1e-06),
        "imagenet 1.0 bicubic", "fb_in1k fb_in22k_ft_in1k"),
    "deit_base_distilled_patch16_224": (dict(distilled=True), "imagenet 0.9 bicubic", "fb_in1k"),
    "deit_base_distilled_patch16_384": (dict(img_size=384, distilled=True), "imagenet 1.0 bicubic", "fb_in1k"),
    "deit_base_patch16_224": (dict(), "imagenet 0.9 bicubic", "fb_in1k"),
    "deit_base_patch16_384": (dict(img_size=384), "imagenet 1.0 bicubic", "fb_in1k"),
    "deit_small_distilled_patch16_224": (
        dict(embed_dim=384, num_heads=6, distilled=True),
        "imagenet 0.9 bicubic", "fb_in1k"),
    "deit_small_patch16_224": (dict(embed_dim=384, num_heads=6), "imagenet 0.9 bicubic", "fb_in1k"),
    "deit_tiny_distilled_patch16_224": (
        dict(embed_dim=192, num_heads=3, distilled=True),
        "imagenet 0.9 bicubic", "fb_in1k"),
    "deit_tiny_patch16_224": (dict(embed_dim=192, num_heads=3), "imagenet 0.9 bicubic", "fb_in1k"),
    "vit_7b_patch16_dinov3": (
        dict(img_size=256, embed_dim=4096, depth=40, num_heads=32, mlp_ratio=2.0, num_classes=0, norm_eps=1e-05,
             init_values=1e-05, num_reg_tokens=4, mlp_layer="swiglu", qkv_bias=False, pos_embed="none",
             rope="dinov3", rope_temperature=100.0, rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m sat493m"),
    "vit_base_patch14_dinov2": (
        dict(img_size=518, patch_size=14, num_classes=0, init_values=1e-05),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_base_patch14_reg1_tipsv2": (
        dict(img_size=448, patch_size=14, num_classes=0, init_values=1.0, num_reg_tokens=1, prefix_pos=False),
        "raw 1.0 bicubic", "webli"),
    "vit_base_patch14_reg4_dinov2": (
        dict(img_size=518, patch_size=14, num_classes=0, init_values=1e-05, num_reg_tokens=4, prefix_pos=False),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_base_patch16_224": (
        dict(),
        "inception 0.9 bicubic",
        "augreg2_in21k_ft_in1k augreg_in21k_ft_in1k orig_in21k_ft_in1k augreg_in1k orig_in21k augreg_in21k "
        "sam_in1k bamboo dino mae"),
    "vit_base_patch16_224_miil": (dict(num_classes=11221, qkv_bias=False), "raw 0.875 bilinear", "in21k in21k_ft_in1k"),
    "vit_base_patch16_384": (
        dict(img_size=384),
        "inception 1.0 bicubic", "augreg_in21k_ft_in1k orig_in21k_ft_in1k augreg_in1k"),
    "vit_base_patch16_clip_224": (
        dict(pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 0.95 bicubic",
        "laion2b_ft_in12k_in1k openai_ft_in12k_in1k laion2b_ft_in1k openai_ft_in1k laion2b_ft_in12k "
        "openai_ft_in12k laion2b laion400m_e32 datacompxl dfn2b metaclip_2pt5b metaclip_400m openai"),
    "vit_base_patch16_clip_384": (
        dict(img_size=384, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "laion2b_ft_in12k_in1k openai_ft_in12k_in1k laion2b_ft_in1k openai_ft_in1k"),
    "vit_base_patch16_clip_quickgelu_224": (
        dict(num_classes=512, pre_norm=True, norm_eps=1e-05, act="quick_gelu", patch_bias=False),
        "clip 1.0 bicubic", "metaclip_2pt5b metaclip_400m openai"),
    "vit_base_patch16_dinov3": (
        dict(img_size=256, num_classes=0, norm_eps=1e-05, init_values=1e-05, num_reg_tokens=4, qkv_bias=False,
             pos_embed="none", rope="dinov3", rope_temperature=100.0, rope_rotate_half=True, global_pool="avg",
             fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m"),
    "vit_base_patch16_dinov3_qkvb": (
        dict(img_size=256, num_classes=0, norm_eps=1e-05, init_values=1e-05, num_reg_tokens=4, k_bias=False,
             pos_embed="none", rope="dinov3", rope_temperature=100.0, rope_rotate_half=True, global_pool="avg",
             fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m eupe_lvd1689m"),
    "vit_base_patch16_gap_224": (
        dict(num_heads=16, class_token=False, global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", ""),
    "vit_base_patch16_lingbot": (
        dict(img_size=512, num_classes=0, norm_eps=1e-05, init_values=1e-05, num_reg_tokens=4, k_bias=False,
             pos_embed="none", rope="dinov3", rope_temperature=100.0, rope_rotate_half=True),
        "imagenet 1.0 bilinear", ""),
    "vit_base_patch16_plus_240": (
        dict(img_size=240, embed_dim=896, num_heads=14, init_values=1e-05),
        "inception 0.95 bicubic", ""),
    "vit_base_patch16_plus_clip_240": (
        dict(img_size=240, embed_dim=896, num_heads=14, num_classes=640, pre_norm=True, norm_eps=1e-05,
             patch_bias=False),
        "clip 1.0 bicubic", "laion400m_e32"),
    "vit_base_patch16_radio_v3": (
        dict(img_size=512, num_classes=0, init_values=1e-05, num_reg_tokens=7, prefix_pos=False, final_norm=False),
        "clip 1.0 bicubic", "c_radio"),
    "vit_base_patch16_reg4_gap_256": (
        dict(img_size=256, class_token=False, prefix_pos=False, global_pool="avg", num_reg_tokens=4),
        "inception 0.9 bicubic", ""),
    "vit_base_patch16_rope_224": (
        dict(init_values=1e-05, pos_embed="none", rope="axial", rope_temperature=100.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_base_patch16_rope_ape_224": (
        dict(init_values=1e-05, prefix_pos=False, rope="axial", rope_temperature=100.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_base_patch16_rope_mixed_224": (
        dict(init_values=1e-05, pos_embed="none", rope="mixed", rope_temperature=10.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_base_patch16_rope_mixed_ape_224": (
        dict(init_values=1e-05, prefix_pos=False, rope="mixed", rope_temperature=10.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_base_patch16_rope_reg1_gap_256": (
        dict(img_size=256, init_values=1e-05, class_token=False, num_reg_tokens=1, k_bias=False, pos_embed="none",
             rope="axial", rope_ref_grid=[16, 16], global_pool="avg", fc_norm=True),
        "inception 0.95 bicubic", "sbb_in1k"),
    "vit_base_patch16_rpn_224": (
        dict(qkv_bias=False, init_values=1e-05, class_token=False, post_norm=True, global_pool="avg"),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_base_patch16_siglip_224": (
        dict(num_classes=0, class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_base_patch16_siglip_256": (
        dict(img_size=256, num_classes=0, class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli webli_i18n"),
    "vit_base_patch16_siglip_384": (
        dict(img_size=384, num_classes=0, class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_base_patch16_siglip_512": (
        dict(img_size=512, num_classes=0, class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_base_patch16_siglip_gap_224": (
        dict(num_classes=0, class_token=False, global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_base_patch16_siglip_gap_256": (
        dict(img_size=256, num_classes=0, class_token=False, global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli webli_i18n"),
    "vit_base_patch16_siglip_gap_384": (
        dict(img_size=384, num_classes=0, class_token=False, global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_base_patch16_siglip_gap_512": (
        dict(img_size=512, num_classes=0, class_token=False, global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_base_patch32_224": (
        dict(patch_size=32),
        "inception 0.9 bicubic", "augreg_in21k_ft_in1k augreg_in1k orig_in21k augreg_in21k sam_in1k"),
    "vit_base_patch32_384": (
        dict(img_size=384, patch_size=32),
        "inception 1.0 bicubic", "augreg_in21k_ft_in1k augreg_in1k"),
    "vit_base_patch32_clip_224": (
        dict(patch_size=32, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 0.9 bicubic",
        "laion2b_ft_in12k_in1k laion2b_ft_in1k openai_ft_in1k laion2b laion400m_e32 datacompxl metaclip_2pt5b "
        "metaclip_400m openai"),
    "vit_base_patch32_clip_256": (
        dict(img_size=256, patch_size=32, num_classes=512, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "datacompxl"),
    "vit_base_patch32_clip_384": (
        dict(img_size=384, patch_size=32, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "laion2b_ft_in12k_in1k openai_ft_in12k_in1k"),
    "vit_base_patch32_clip_448": (
        dict(img_size=448, patch_size=32, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "laion2b_ft_in12k_in1k"),
    "vit_base_patch32_clip_quickgelu_224": (
        dict(patch_size=32, num_classes=512, pre_norm=True, norm_eps=1e-05, act="quick_gelu", patch_bias=False),
        "clip 0.9 bicubic", "laion400m_e32 metaclip_2pt5b metaclip_400m openai"),
    "vit_base_patch32_plus_256": (
        dict(img_size=256, patch_size=32, embed_dim=896, num_heads=14, init_values=1e-05),
        "inception 0.95 bicubic", ""),
    "vit_base_patch32_siglip_256": (
        dict(img_size=256, patch_size=32, num_classes=0, class_token=False, global_pool="map", act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_base_patch32_siglip_gap_256": (
        dict(img_size=256, patch_size=32, num_classes=0, class_token=False, global_pool="avg", fc_norm=False,
             act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_base_patch8_224": (
        dict(patch_size=8),
        "inception 0.9 bicubic", "augreg2_in21k_ft_in1k augreg_in21k_ft_in1k augreg_in21k dino"),
    "vit_betwixt_patch16_gap_256": (
        dict(img_size=256, embed_dim=640, num_heads=10, class_token=False, global_pool="avg", qkv_bias=False,
             init_values=1e-06, fc_norm=False),
        "inception 0.95 bicubic", ""),
    "vit_betwixt_patch16_reg1_gap_256": (
        dict(img_size=256, embed_dim=640, num_heads=10, init_values=1e-05, class_token=False, prefix_pos=False,
             num_reg_tokens=1, global_pool="avg"),
        "inception 0.95 bicubic", "sbb_in1k"),
    "vit_betwixt_patch16_reg4_gap_256": (
        dict(img_size=256, embed_dim=640, num_heads=10, init_values=1e-05, class_token=False, prefix_pos=False,
             num_reg_tokens=4, global_pool="avg"),
        "inception 0.95 bicubic", "sbb2_e200_in12k_ft_in1k sbb_in12k_ft_in1k sbb_in1k sbb2_e200_in12k sbb_in12k"),
    "vit_betwixt_patch16_reg4_gap_384": (
        dict(img_size=384, embed_dim=640, num_heads=10, init_values=1e-05, class_token=False, prefix_pos=False,
             num_reg_tokens=4, global_pool="avg"),
        "inception 1.0 bicubic", "sbb2_e200_in12k_ft_in1k"),
    "vit_betwixt_patch16_rope_reg4_gap_256": (
        dict(img_size=256, embed_dim=640, num_heads=10, init_values=1e-05, class_token=False, num_reg_tokens=4,
             k_bias=False, pos_embed="none", rope="axial", rope_ref_grid=[16, 16], global_pool="avg", fc_norm=True),
        "clip 0.95 bicubic", "sbb_in1k"),
    "vit_betwixt_patch32_clip_224": (
        dict(patch_size=32, embed_dim=640, num_heads=10, num_classes=512, pre_norm=True, norm_eps=1e-05,
             patch_bias=False),
        "clip 0.9 bicubic", "tinyclip_laion400m"),
    "vit_giant_patch14_224": (
        dict(patch_size=14, embed_dim=1408, depth=40, num_heads=16, mlp_ratio=4.363636363636363),
        "inception 0.9 bicubic", ""),
    "vit_giant_patch14_clip_224": (
        dict(patch_size=14, embed_dim=1408, depth=40, num_heads=16, mlp_ratio=4.363636363636363, num_classes=1024,
             pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "laion2b"),
    "vit_giant_patch14_dinov2": (
        dict(img_size=518, patch_size=14, embed_dim=1536, depth=40, num_heads=24, mlp_ratio=5.33334, num_classes=0,
             init_values=1e-05, mlp_layer="swiglu_packed"),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_giant_patch14_reg1_tipsv2": (
        dict(img_size=448, patch_size=14, embed_dim=1536, depth=40, num_heads=24, mlp_ratio=5.33334, num_classes=0,
             init_values=1.0, mlp_layer="swiglu_packed", num_reg_tokens=1, prefix_pos=False),
        "raw 1.0 bicubic", "webli"),
    "vit_giant_patch14_reg4_dinov2": (
        dict(img_size=518, patch_size=14, embed_dim=1536, depth=40, num_heads=24, mlp_ratio=5.33334, num_classes=0,
             init_values=1e-05, mlp_layer="swiglu_packed", num_reg_tokens=4, prefix_pos=False),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_giant_patch16_gap_224": (
        dict(embed_dim=1408, depth=40, num_heads=16, mlp_ratio=4.363636363636363, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False),
        "imagenet 0.9 bicubic", ""),
    "vit_giant_patch16_lingbot": (
        dict(img_size=512, embed_dim=1536, depth=40, num_heads=24, mlp_ratio=2.6666666666666665, num_classes=0,
             norm_eps=1e-05, init_values=1e-05, num_reg_tokens=4, mlp_layer="swiglu", qkv_bias=False,
             pos_embed="none", rope="dinov3", rope_temperature=100.0, rope_rotate_half=True),
        "imagenet 1.0 bilinear", ""),
    "vit_giant_patch16_radio_v3": (
        dict(img_size=512, embed_dim=1536, depth=40, num_heads=24, num_classes=0, num_reg_tokens=7, prefix_pos=False,
             final_norm=False),
        "clip 1.0 bicubic", "c_radio"),
    "vit_giantopt_patch16_siglip_256": (
        dict(img_size=256, embed_dim=1536, depth=40, num_heads=16, num_classes=0, class_token=False,
             global_pool="map", act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_giantopt_patch16_siglip_384": (
        dict(img_size=384, embed_dim=1536, depth=40, num_heads=16, num_classes=0, class_token=False,
             global_pool="map", act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_giantopt_patch16_siglip_gap_256": (
        dict(img_size=256, embed_dim=1536, depth=40, num_heads=16, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False, act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_giantopt_patch16_siglip_gap_384": (
        dict(img_size=384, embed_dim=1536, depth=40, num_heads=16, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False, act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_gigantic_patch14_224": (
        dict(patch_size=14, embed_dim=1664, depth=48, num_heads=16, mlp_ratio=4.923076923076923),
        "inception 0.9 bicubic", ""),
    "vit_gigantic_patch14_clip_224": (
        dict(patch_size=14, embed_dim=1664, depth=48, num_heads=16, mlp_ratio=4.923076923076923, num_classes=1280,
             pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "laion2b metaclip2_worldwide metaclip_2pt5b"),
    "vit_gigantic_patch14_clip_378": (
        dict(img_size=378, patch_size=14, embed_dim=1664, depth=48, num_heads=16, mlp_ratio=4.923076923076923,
             num_classes=1280, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "metaclip2_worldwide"),
    "vit_gigantic_patch14_clip_quickgelu_224": (
        dict(patch_size=14, embed_dim=1664, depth=48, num_heads=16, mlp_ratio=4.923076923076923, num_classes=1280,
             pre_norm=True, norm_eps=1e-05, act="quick_gelu", patch_bias=False),
        "clip 1.0 bicubic", "metaclip_2pt5b"),
    "vit_huge_patch14_224": (
        dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, num_classes=0),
        "inception 0.9 bicubic", "orig_in21k mae"),
    "vit_huge_patch14_clip_224": (
        dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic",
        "laion2b_ft_in12k_in1k laion2b_ft_in1k laion2b_ft_in12k laion2b dfn5b metaclip2_worldwide metaclip_2pt5b "
        "metaclip_altogether"),
    "vit_huge_patch14_clip_336": (
        dict(img_size=336, patch_size=14, embed_dim=1280, depth=32, num_heads=16, pre_norm=True, norm_eps=1e-05,
             patch_bias=False),
        "clip 1.0 bicubic", "laion2b_ft_in12k_in1k"),
    "vit_huge_patch14_clip_378": (
        dict(img_size=378, patch_size=14, embed_dim=1280, depth=32, num_heads=16, num_classes=1024, pre_norm=True,
             norm_eps=1e-05, patch_bias=False),
        "clip 1.0 bicubic", "dfn5b metaclip2_worldwide"),
    "vit_huge_patch14_clip_quickgelu_224": (
        dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, num_classes=1024, pre_norm=True, norm_eps=1e-05,
             act="quick_gelu", patch_bias=False),
        "clip 1.0 bicubic", "dfn5b metaclip2_worldwide metaclip_2pt5b"),
    "vit_huge_patch14_clip_quickgelu_378": (
        dict(img_size=378, patch_size=14, embed_dim=1280, depth=32, num_heads=16, num_classes=1024, pre_norm=True,
             norm_eps=1e-05, act="quick_gelu", patch_bias=False),
        "clip 1.0 bicubic", "dfn5b"),
    "vit_huge_patch14_gap_224": (
        dict(patch_size=14, embed_dim=1280, depth=32, num_heads=16, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False),
        "imagenet 0.9 bicubic", ""),
    "vit_huge_patch16_gap_448": (
        dict(img_size=448, embed_dim=1280, depth=32, num_heads=16, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", ""),
    "vit_huge_patch16_radio_v3": (
        dict(img_size=512, embed_dim=1280, depth=32, num_heads=16, num_classes=0, num_reg_tokens=7, prefix_pos=False,
             final_norm=False),
        "clip 1.0 bicubic", "c_radio"),
    "vit_huge_patch16_radio_v4": (
        dict(img_size=512, embed_dim=1280, depth=32, num_heads=16, num_classes=0, num_reg_tokens=9, prefix_pos=False,
             final_norm=False),
        "clip 1.0 bicubic", "c_radio"),
    "vit_huge_plus_patch16_dinov3": (
        dict(img_size=256, embed_dim=1280, depth=32, num_heads=20, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, mlp_layer="swiglu", qkv_bias=False, pos_embed="none", rope="dinov3",
             rope_temperature=100.0, rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m"),
    "vit_huge_plus_patch16_dinov3_qkvb": (
        dict(img_size=256, embed_dim=1280, depth=32, num_heads=20, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, mlp_layer="swiglu", k_bias=False, pos_embed="none", rope="dinov3",
             rope_temperature=100.0, rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m"),
    "vit_intern300m_patch14_448": (
        dict(img_size=448, patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=0, init_values=0.1,
             final_norm=False),
        "imagenet 1.0 bicubic", "ogvl_dist ogvl_2pt5"),
    "vit_large_patch14_224": (dict(patch_size=14, embed_dim=1024, depth=24, num_heads=16), "inception 0.9 bicubic", ""),
    "vit_large_patch14_clip_224": (
        dict(patch_size=14, embed_dim=1024, depth=24, num_heads=16, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "inception 1.0 bicubic",
        "laion2b_ft_in12k_in1k openai_ft_in12k_in1k laion2b_ft_in1k openai_ft_in1k laion2b_ft_in12k "
        "openai_ft_in12k laion2b laion400m_e32 datacompxl dfn2b_s39b dfn2b metaclip_2pt5b metaclip_400m openai "
        "apple_mclip2_dfndr2b"),
    "vit_large_patch14_clip_336": (
        dict(img_size=336, patch_size=14, embed_dim=1024, depth=24, num_heads=16, pre_norm=True, norm_eps=1e-05,
             patch_bias=False),
        "inception 1.0 bicubic", "laion2b_ft_in12k_in1k openai_ft_in12k_in1k laion2b_ft_in1k openai"),
    "vit_large_patch14_clip_quickgelu_224": (
        dict(patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=768, pre_norm=True, norm_eps=1e-05,
             act="quick_gelu", patch_bias=False),
        "clip 1.0 bicubic", "dfn2b metaclip_2pt5b metaclip_400m openai"),
    "vit_large_patch14_clip_quickgelu_336": (
        dict(img_size=336, patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=768, pre_norm=True,
             norm_eps=1e-05, act="quick_gelu", patch_bias=False),
        "clip 1.0 bicubic", "openai"),
    "vit_large_patch14_dinov2": (
        dict(img_size=518, patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=0, init_values=1e-05),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_large_patch14_reg1_tipsv2": (
        dict(img_size=448, patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=0, init_values=1.0,
             num_reg_tokens=1, prefix_pos=False),
        "raw 1.0 bicubic", "webli"),
    "vit_large_patch14_reg4_dinov2": (
        dict(img_size=518, patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=0, init_values=1e-05,
             num_reg_tokens=4, prefix_pos=False),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_large_patch16_224": (
        dict(embed_dim=1024, depth=24, num_heads=16),
        "inception 0.9 bicubic", "augreg_in21k_ft_in1k orig_in21k augreg_in21k mae"),
    "vit_large_patch16_384": (
        dict(img_size=384, embed_dim=1024, depth=24, num_heads=16),
        "inception 1.0 bicubic", "augreg_in21k_ft_in1k"),
    "vit_large_patch16_dinov3": (
        dict(img_size=256, embed_dim=1024, depth=24, num_heads=16, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, qkv_bias=False, pos_embed="none", rope="dinov3", rope_temperature=100.0,
             rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m sat493m"),
    "vit_large_patch16_dinov3_qkvb": (
        dict(img_size=256, embed_dim=1024, depth=24, num_heads=16, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, k_bias=False, pos_embed="none", rope="dinov3", rope_temperature=100.0,
             rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m sat493m"),
    "vit_large_patch16_lingbot": (
        dict(img_size=512, embed_dim=1024, depth=24, num_heads=16, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, k_bias=False, pos_embed="none", rope="dinov3", rope_temperature=100.0,
             rope_rotate_half=True),
        "imagenet 1.0 bilinear", ""),
    "vit_large_patch16_radio_v3": (
        dict(img_size=512, embed_dim=1024, depth=24, num_heads=16, num_classes=0, init_values=1e-05,
             num_reg_tokens=7, prefix_pos=False, final_norm=False),
        "clip 1.0 bicubic", "c_radio"),
    "vit_large_patch16_rope_224": (
        dict(embed_dim=1024, depth=24, num_heads=16, init_values=1e-05, pos_embed="none", rope="axial",
             rope_temperature=100.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_large_patch16_rope_ape_224": (
        dict(embed_dim=1024, depth=24, num_heads=16, init_values=1e-05, prefix_pos=False, rope="axial",
             rope_temperature=100.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_large_patch16_rope_mixed_224": (
        dict(embed_dim=1024, depth=24, num_heads=16, init_values=1e-05, pos_embed="none", rope="mixed",
             rope_temperature=10.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_large_patch16_rope_mixed_ape_224": (
        dict(embed_dim=1024, depth=24, num_heads=16, init_values=1e-05, prefix_pos=False, rope="mixed",
             rope_temperature=10.0, rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_large_patch16_siglip_256": (
        dict(img_size=256, embed_dim=1024, depth=24, num_heads=16, num_classes=0, class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_large_patch16_siglip_384": (
        dict(img_size=384, embed_dim=1024, depth=24, num_heads=16, num_classes=0, class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_large_patch16_siglip_512": (
        dict(img_size=512, embed_dim=1024, depth=24, num_heads=16, num_classes=0, class_token=False,
             global_pool="map", act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_large_patch16_siglip_gap_256": (
        dict(img_size=256, embed_dim=1024, depth=24, num_heads=16, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_large_patch16_siglip_gap_384": (
        dict(img_size=384, embed_dim=1024, depth=24, num_heads=16, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_large_patch16_siglip_gap_512": (
        dict(img_size=512, embed_dim=1024, depth=24, num_heads=16, num_classes=0, class_token=False,
             global_pool="avg", fc_norm=False, act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_large_patch32_224": (
        dict(patch_size=32, embed_dim=1024, depth=24, num_heads=16, num_classes=0),
        "inception 0.9 bicubic", "orig_in21k"),
    "vit_large_patch32_384": (
        dict(img_size=384, patch_size=32, embed_dim=1024, depth=24, num_heads=16),
        "inception 1.0 bicubic", "orig_in21k_ft_in1k"),
    "vit_little_patch16_reg1_gap_256": (
        dict(img_size=256, embed_dim=320, depth=14, num_heads=5, mlp_ratio=5.6, init_values=1e-05, class_token=False,
             prefix_pos=False, num_reg_tokens=1, global_pool="avg"),
        "inception 0.95 bicubic", "sbb_in12k_ft_in1k sbb_in12k"),
    "vit_little_patch16_reg4_gap_256": (
        dict(img_size=256, embed_dim=320, depth=14, num_heads=5, mlp_ratio=5.6, init_values=1e-05, class_token=False,
             prefix_pos=False, num_reg_tokens=4, global_pool="avg"),
        "inception 0.95 bicubic", "sbb_in1k"),
    "vit_medium_patch16_clip_224": (
        dict(embed_dim=512, num_heads=8, num_classes=512, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 0.9 bicubic", "tinyclip_yfcc15m"),
    "vit_medium_patch16_gap_240": (
        dict(img_size=240, embed_dim=512, num_heads=8, num_classes=11821, class_token=False, global_pool="avg",
             qkv_bias=False, init_values=1e-06, fc_norm=False),
        "inception 0.95 bicubic", "sw_in12k"),
    "vit_medium_patch16_gap_256": (
        dict(img_size=256, embed_dim=512, num_heads=8, class_token=False, global_pool="avg", qkv_bias=False,
             init_values=1e-06, fc_norm=False),
        "inception 0.95 bicubic", "sw_in12k_ft_in1k"),
    "vit_medium_patch16_gap_384": (
        dict(img_size=384, embed_dim=512, num_heads=8, class_token=False, global_pool="avg", qkv_bias=False,
             init_values=1e-06, fc_norm=False),
        "inception 0.95 bicubic", "sw_in12k_ft_in1k"),
    "vit_medium_patch16_reg1_gap_256": (
        dict(img_size=256, embed_dim=512, num_heads=8, init_values=1e-05, class_token=False, prefix_pos=False,
             num_reg_tokens=1, global_pool="avg"),
        "inception 0.95 bicubic", "sbb_in1k"),
    "vit_medium_patch16_reg4_gap_256": (
        dict(img_size=256, embed_dim=512, num_heads=8, init_values=1e-05, class_token=False, prefix_pos=False,
             num_reg_tokens=4, global_pool="avg"),
        "inception 0.95 bicubic", "sbb_in12k_ft_in1k sbb_in1k sbb_in12k"),
    "vit_medium_patch16_rope_reg1_gap_256": (
        dict(img_size=256, embed_dim=512, num_heads=8, init_values=1e-05, class_token=False, num_reg_tokens=1,
             k_bias=False, pos_embed="none", rope="axial", rope_ref_grid=[16, 16], global_pool="avg", fc_norm=True),
        "inception 0.95 bicubic", "sbb_in1k"),
    "vit_medium_patch32_clip_224": (
        dict(patch_size=32, embed_dim=512, num_heads=8, num_classes=512, pre_norm=True, norm_eps=1e-05,
             patch_bias=False),
        "clip 0.9 bicubic", "tinyclip_laion400m"),
    "vit_mediumd_patch16_reg4_gap_256": (
        dict(img_size=256, embed_dim=512, depth=20, num_heads=8, init_values=1e-05, class_token=False,
             prefix_pos=False, num_reg_tokens=4, global_pool="avg"),
        "inception 0.95 bicubic", "sbb2_e200_in12k_ft_in1k sbb_in12k_ft_in1k sbb2_e200_in12k sbb_in12k"),
    "vit_mediumd_patch16_reg4_gap_384": (
        dict(img_size=384, embed_dim=512, depth=20, num_heads=8, init_values=1e-05, class_token=False,
             prefix_pos=False, num_reg_tokens=4, global_pool="avg"),
        "inception 1.0 bicubic", "sbb2_e200_in12k_ft_in1k"),
    "vit_mediumd_patch16_rope_reg1_gap_256": (
        dict(img_size=256, embed_dim=512, depth=20, num_heads=8, init_values=1e-05, class_token=False,
             num_reg_tokens=1, qkv_bias=False, pos_embed="none", rope="axial", rope_ref_grid=[16, 16],
             global_pool="avg", fc_norm=True),
        "inception 0.95 bicubic", "sbb_in1k"),
    "vit_pe_core_base_patch16_224": (
        dict(num_classes=1024, norm_eps=1e-05, rope="axial", rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[14,
             14], pre_norm=True, patch_bias=False, global_pool="map", fc_norm=False, pool_include_prefix=True,
             pool_num_heads=8),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_core_gigantic_patch14_448": (
        dict(img_size=448, patch_size=14, embed_dim=1536, depth=50, num_heads=16, mlp_ratio=5.833333333333333,
             num_classes=1280, norm_eps=1e-05, class_token=False, rope="axial", rope_xy=True, rope_ref_grid=[32, 32],
             pre_norm=True, patch_bias=False, global_pool="map", fc_norm=False, pool_num_heads=8, pool_mlp_ratio=4.0),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_core_large_patch14_336": (
        dict(img_size=336, patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=1024, norm_eps=1e-05,
             rope="axial", rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[24, 24], pre_norm=True,
             patch_bias=False, global_pool="map", fc_norm=False, pool_include_prefix=True, pool_num_heads=8),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_core_small_patch16_384": (
        dict(img_size=384, embed_dim=384, num_heads=6, num_classes=512, norm_eps=1e-05, rope="axial",
             rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[24, 24], pre_norm=True, patch_bias=False,
             global_pool="map", fc_norm=False, pool_include_prefix=True, pool_num_heads=8),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_core_tiny_patch16_384": (
        dict(img_size=384, embed_dim=192, num_heads=3, num_classes=512, norm_eps=1e-05, rope="axial",
             rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[24, 24], pre_norm=True, patch_bias=False,
             global_pool="map", fc_norm=False, pool_include_prefix=True, pool_num_heads=8),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_lang_gigantic_patch14_448": (
        dict(img_size=448, patch_size=14, embed_dim=1536, depth=47, num_heads=16, mlp_ratio=5.833333333333333,
             num_classes=0, norm_eps=1e-05, init_values=0.1, class_token=False, rope="axial", rope_xy=True,
             rope_ref_grid=[32, 32], pre_norm=True, patch_bias=False, global_pool="avg", fc_norm=False,
             final_norm=False),
        "inception 1.0 bicubic", "fb fb_tiling"),
    "vit_pe_lang_large_patch14_448": (
        dict(img_size=448, patch_size=14, embed_dim=1024, depth=23, num_heads=16, num_classes=0, norm_eps=1e-05,
             init_values=0.1, rope="axial", rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[32, 32],
             pre_norm=True, patch_bias=False, global_pool="avg", fc_norm=False, final_norm=False),
        "inception 1.0 bicubic", "fb fb_tiling"),
    "vit_pe_spatial_base_patch16_512": (
        dict(img_size=512, num_classes=0, norm_eps=1e-05, rope="axial", rope_grid_offset=1.0, rope_xy=True,
             rope_ref_grid=[32, 32], pre_norm=True, patch_bias=False, global_pool="avg", fc_norm=False,
             final_norm=False),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_spatial_gigantic_patch14_448": (
        dict(img_size=448, patch_size=14, embed_dim=1536, depth=50, num_heads=16, mlp_ratio=5.833333333333333,
             num_classes=0, norm_eps=1e-05, init_values=0.1, class_token=False, rope="axial", rope_xy=True,
             rope_ref_grid=[32, 32], pre_norm=True, patch_bias=False, global_pool="avg", fc_norm=False,
             final_norm=False),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_spatial_large_patch14_448": (
        dict(img_size=448, patch_size=14, embed_dim=1024, depth=24, num_heads=16, num_classes=0, norm_eps=1e-05,
             rope="axial", rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[32, 32], pre_norm=True,
             patch_bias=False, global_pool="avg", fc_norm=False, final_norm=False),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_spatial_small_patch16_512": (
        dict(img_size=512, embed_dim=384, num_heads=6, num_classes=0, norm_eps=1e-05, rope="axial",
             rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[32, 32], pre_norm=True, patch_bias=False,
             global_pool="avg", fc_norm=False, final_norm=False),
        "inception 1.0 bicubic", "fb"),
    "vit_pe_spatial_tiny_patch16_512": (
        dict(img_size=512, embed_dim=192, num_heads=3, num_classes=0, norm_eps=1e-05, rope="axial",
             rope_grid_offset=1.0, rope_xy=True, rope_ref_grid=[32, 32], pre_norm=True, patch_bias=False,
             global_pool="avg", fc_norm=False, final_norm=False),
        "inception 1.0 bicubic", "fb"),
    "vit_relpos_base_patch16_224": (
        dict(pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg", fc_norm=True, qkv_bias=False,
             rel_pos="mlp"),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_relpos_base_patch16_cls_224": (
        dict(pos_embed="none", init_values=1e-06, fc_norm=False, qkv_bias=False, rel_pos="mlp"),
        "inception 0.9 bicubic", ""),
    "vit_relpos_base_patch16_clsgap_224": (
        dict(pos_embed="none", init_values=1e-06, global_pool="avg", fc_norm=True, qkv_bias=False, rel_pos="mlp"),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_relpos_base_patch16_plus_240": (
        dict(img_size=240, embed_dim=896, num_heads=14, pos_embed="none", init_values=1e-06, class_token=False,
             global_pool="avg", fc_norm=False, rel_pos="mlp"),
        "inception 0.9 bicubic", ""),
    "vit_relpos_base_patch16_rpn_224": (
        dict(pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg", fc_norm=False,
             qkv_bias=False, rel_pos="mlp", post_norm=True),
        "inception 0.9 bicubic", ""),
    "vit_relpos_base_patch32_plus_rpn_256": (
        dict(img_size=256, patch_size=32, embed_dim=896, num_heads=14, pos_embed="none", init_values=1e-06,
             class_token=False, global_pool="avg", fc_norm=False, rel_pos="mlp", post_norm=True),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_relpos_medium_patch16_224": (
        dict(embed_dim=512, num_heads=8, pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg",
             fc_norm=True, qkv_bias=False, rel_pos="mlp"),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_relpos_medium_patch16_cls_224": (
        dict(embed_dim=512, num_heads=8, pos_embed="none", init_values=1e-06, fc_norm=False, qkv_bias=False,
             rel_pos="mlp", rel_pos_dim=256),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_relpos_medium_patch16_rpn_224": (
        dict(embed_dim=512, num_heads=8, pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg",
             fc_norm=False, qkv_bias=False, rel_pos="mlp", post_norm=True),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_relpos_small_patch16_224": (
        dict(embed_dim=384, num_heads=6, pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg",
             fc_norm=True, qkv_bias=False, rel_pos="mlp"),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_relpos_small_patch16_rpn_224": (
        dict(embed_dim=384, num_heads=6, pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg",
             fc_norm=False, qkv_bias=False, rel_pos="mlp", post_norm=True),
        "inception 0.9 bicubic", ""),
    "vit_small_patch14_dinov2": (
        dict(img_size=518, patch_size=14, embed_dim=384, num_heads=6, num_classes=0, init_values=1e-05),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_small_patch14_reg4_dinov2": (
        dict(img_size=518, patch_size=14, embed_dim=384, num_heads=6, num_classes=0, init_values=1e-05,
             num_reg_tokens=4, prefix_pos=False),
        "imagenet 1.0 bicubic", "lvd142m"),
    "vit_small_patch16_224": (
        dict(embed_dim=384, num_heads=6),
        "inception 0.9 bicubic", "augreg_in21k_ft_in1k augreg_in1k augreg_in21k dino"),
    "vit_small_patch16_36x1_224": (
        dict(embed_dim=384, depth=36, num_heads=6, init_values=1e-05),
        "inception 0.9 bicubic", ""),
    "vit_small_patch16_384": (
        dict(img_size=384, embed_dim=384, num_heads=6),
        "inception 1.0 bicubic", "augreg_in21k_ft_in1k augreg_in1k"),
    "vit_small_patch16_dinov3": (
        dict(img_size=256, embed_dim=384, num_heads=6, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, qkv_bias=False, pos_embed="none", rope="dinov3", rope_temperature=100.0,
             rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m"),
    "vit_small_patch16_dinov3_qkvb": (
        dict(img_size=256, embed_dim=384, num_heads=6, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, k_bias=False, pos_embed="none", rope="dinov3", rope_temperature=100.0,
             rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m eupe_lvd1689m"),
    "vit_small_patch16_lingbot": (
        dict(img_size=512, embed_dim=384, num_heads=6, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, k_bias=False, pos_embed="none", rope="dinov3", rope_temperature=100.0,
             rope_rotate_half=True),
        "imagenet 1.0 bilinear", ""),
    "vit_small_patch16_rope_224": (
        dict(embed_dim=384, num_heads=6, init_values=1e-05, pos_embed="none", rope="axial", rope_temperature=100.0,
             rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_small_patch16_rope_ape_224": (
        dict(embed_dim=384, num_heads=6, init_values=1e-05, prefix_pos=False, rope="axial", rope_temperature=100.0,
             rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_small_patch16_rope_mixed_224": (
        dict(embed_dim=384, num_heads=6, init_values=1e-05, pos_embed="none", rope="mixed", rope_temperature=10.0,
             rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_small_patch16_rope_mixed_ape_224": (
        dict(embed_dim=384, num_heads=6, init_values=1e-05, prefix_pos=False, rope="mixed", rope_temperature=10.0,
             rope_xy=True),
        "imagenet 0.9 bicubic", "naver_in1k"),
    "vit_small_patch32_224": (
        dict(patch_size=32, embed_dim=384, num_heads=6),
        "inception 0.9 bicubic", "augreg_in21k_ft_in1k augreg_in21k"),
    "vit_small_patch32_384": (
        dict(img_size=384, patch_size=32, embed_dim=384, num_heads=6),
        "inception 1.0 bicubic", "augreg_in21k_ft_in1k"),
    "vit_small_patch8_224": (
        dict(patch_size=8, embed_dim=384, num_heads=6, num_classes=0),
        "imagenet 0.9 bicubic", "dino"),
    "vit_small_plus_patch16_dinov3": (
        dict(img_size=256, embed_dim=384, num_heads=6, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, mlp_layer="swiglu", qkv_bias=False, pos_embed="none", rope="dinov3",
             rope_temperature=100.0, rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m"),
    "vit_small_plus_patch16_dinov3_qkvb": (
        dict(img_size=256, embed_dim=384, num_heads=6, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, mlp_layer="swiglu", k_bias=False, pos_embed="none", rope="dinov3",
             rope_temperature=100.0, rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "lvd1689m"),
    "vit_so150m2_patch16_reg1_gap_256": (
        dict(img_size=256, embed_dim=832, depth=21, num_heads=13, mlp_ratio=2.6153846153846154, init_values=1e-05,
             qkv_bias=False, class_token=False, num_reg_tokens=1, global_pool="avg"),
        "inception 1.0 bicubic", "sbb_e200_in12k_ft_in1k sbb_e200_in12k"),
    "vit_so150m2_patch16_reg1_gap_384": (
        dict(img_size=384, embed_dim=832, depth=21, num_heads=13, mlp_ratio=2.6153846153846154, init_values=1e-05,
             qkv_bias=False, class_token=False, num_reg_tokens=1, global_pool="avg"),
        "inception 1.0 bicubic", "sbb_e200_in12k_ft_in1k"),
    "vit_so150m2_patch16_reg1_gap_448": (
        dict(img_size=448, embed_dim=832, depth=21, num_heads=13, mlp_ratio=2.6153846153846154, init_values=1e-05,
             qkv_bias=False, class_token=False, num_reg_tokens=1, global_pool="avg"),
        "inception 1.0 bicubic", "sbb_e200_in12k_ft_in1k"),
    "vit_so150m_patch16_reg4_gap_256": (
        dict(img_size=256, embed_dim=896, depth=18, num_heads=14, mlp_ratio=2.572, class_token=False,
             num_reg_tokens=4, global_pool="avg", fc_norm=False),
        "inception 0.95 bicubic", "sbb_e250_in12k_ft_in1k sbb_e250_in12k"),
    "vit_so150m_patch16_reg4_gap_384": (
        dict(img_size=384, embed_dim=896, depth=18, num_heads=14, mlp_ratio=2.572, class_token=False,
             num_reg_tokens=4, global_pool="avg", fc_norm=False),
        "inception 1.0 bicubic", "sbb_e250_in12k_ft_in1k"),
    "vit_so150m_patch16_reg4_map_256": (
        dict(img_size=256, embed_dim=896, depth=18, num_heads=14, mlp_ratio=2.572, class_token=False,
             num_reg_tokens=4, global_pool="map"),
        "inception 0.9 bicubic", ""),
    "vit_so400m_patch14_reg1_tipsv2": (
        dict(img_size=448, patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.736111111111111,
             num_classes=0, init_values=1.0, num_reg_tokens=1, prefix_pos=False),
        "raw 1.0 bicubic", "webli"),
    "vit_so400m_patch14_siglip_224": (
        dict(patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli"),
    "vit_so400m_patch14_siglip_378": (
        dict(img_size=378, patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="map"),
        "inception 0.9 bicubic", "v2_webli webli webli_ft_in1k"),
    "vit_so400m_patch14_siglip_gap_224": (
        dict(patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli pali_mix pali_pt pali2_3b_pt pali2_10b_pt"),
    "vit_so400m_patch14_siglip_gap_378": (
        dict(img_size=378, patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="avg", fc_norm=False),
        "inception 0.9 bicubic", "v2_webli webli webli_ft_in1k"),
    "vit_so400m_patch14_siglip_gap_448": (
        dict(img_size=448, patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="avg", fc_norm=False),
        "inception 1.0 bicubic",
        "pali_mix pali_pt pali_refcoco_seg pali_ocrvqa pali2_3b_pt pali2_10b_pt pali2_3b_docci pali2_10b_docci"),
    "vit_so400m_patch14_siglip_gap_896": (
        dict(img_size=896, patch_size=14, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="avg", fc_norm=False),
        "inception 1.0 bicubic", "pali_pt pali_refcoco_seg pali_ocrvqa pali2_3b_pt pali2_10b_pt"),
    "vit_so400m_patch16_radio_v4": (
        dict(img_size=512, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.736111111111111, num_classes=0,
             num_reg_tokens=9, prefix_pos=False, final_norm=False),
        "clip 1.0 bicubic", "c_radio"),
    "vit_so400m_patch16_siglip_256": (
        dict(img_size=256, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="map", act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli webli_i18n"),
    "vit_so400m_patch16_siglip_384": (
        dict(img_size=384, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="map", act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_so400m_patch16_siglip_512": (
        dict(img_size=512, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="map", act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_so400m_patch16_siglip_gap_256": (
        dict(img_size=256, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="avg", fc_norm=False, act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli webli_i18n"),
    "vit_so400m_patch16_siglip_gap_384": (
        dict(img_size=384, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="avg", fc_norm=False, act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_so400m_patch16_siglip_gap_512": (
        dict(img_size=512, embed_dim=1152, depth=27, num_heads=16, mlp_ratio=3.7362, num_classes=0,
             class_token=False, global_pool="avg", fc_norm=False, act="gelu_tanh"),
        "inception 0.9 bicubic", "v2_webli"),
    "vit_srelpos_medium_patch16_224": (
        dict(embed_dim=512, num_heads=8, pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg",
             fc_norm=False, qkv_bias=False, rel_pos="mlp_shared", rel_pos_dim=512),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_srelpos_small_patch16_224": (
        dict(embed_dim=384, num_heads=6, pos_embed="none", init_values=1e-06, class_token=False, global_pool="avg",
             fc_norm=False, qkv_bias=False, rel_pos="mlp_shared", rel_pos_dim=384),
        "inception 0.9 bicubic", "sw_in1k"),
    "vit_tiny_patch16_224": (
        dict(embed_dim=192, num_heads=3),
        "inception 0.9 bicubic", "augreg_in21k_ft_in1k augreg_in21k"),
    "vit_tiny_patch16_384": (
        dict(img_size=384, embed_dim=192, num_heads=3),
        "inception 1.0 bicubic", "augreg_in21k_ft_in1k"),
    "vit_tiny_patch16_dinov3_qkvb": (
        dict(img_size=256, embed_dim=192, num_heads=3, num_classes=0, norm_eps=1e-05, init_values=1e-05,
             num_reg_tokens=4, k_bias=False, pos_embed="none", rope="dinov3", rope_temperature=100.0,
             rope_rotate_half=True, global_pool="avg", fc_norm=False),
        "imagenet 1.0 bicubic", "eupe_lvd1689m"),
    "vit_wee_patch16_reg1_gap_256": (
        dict(img_size=256, embed_dim=256, depth=14, num_heads=4, mlp_ratio=5.0, init_values=1e-05, class_token=False,
             prefix_pos=False, num_reg_tokens=1, global_pool="avg"),
        "inception 0.95 bicubic", "sbb_in1k"),
    "vit_xsmall_patch16_clip_224": (
        dict(embed_dim=256, depth=10, num_heads=4, num_classes=512, pre_norm=True, norm_eps=1e-05, patch_bias=False),
        "clip 0.9 bicubic", "tinyclip_yfcc15m"),
}


def hub_name(name: str) -> str:
    """The name timm's hub repos use for these weights."""
    return name.replace("_clip_quickgelu_", "_clip_")


# Names timm registers that vitkit refuses on purpose: a pattern (fnmatch) and the one-line reason.
REFUSED: dict[str, str] = {
    "vit_*_patch16_18x2_224": "its blocks run two attention and two MLP branches side by side (timm's "
                              "ParallelThingsBlock), which vitkit's block does not have",
    "vit_*_xp_224": "its blocks fuse attention and MLP into one parallel branch with RMSNorm (timm's "
                    "ParallelScalingBlock), which vitkit's block does not have",
    "vit_pwee_patch16_reg1_gap_256": "its blocks fuse attention and MLP into one parallel branch (timm's "
                                     "ParallelScalingBlock), which vitkit's block does not have",
    "vit_d*wee_patch16_reg1_gap_256": "it uses differential attention (two softmax maps subtracted), which "
                                      "vitkit's attention does not have",
    "vit_dlittle_patch16_reg1_gap_256": "it uses differential attention (two softmax maps subtracted), which "
                                        "vitkit's attention does not have",
    "vit_so400m_patch14_siglip*_384": "384 px is not a multiple of its 14 px patch (timm's convolution drops the "
                                      "last 6 pixel rows and columns); its weights load into "
                                      "vit_so400m_patch14_siglip(_gap)_378, the same 27x27 grid",
    "vit_*_sapiens2": "its blocks use RMSNorm, separate q/k/v projections with grouped-query attention and "
                      "attention-only LayerScale (timm's eva.py), which vitkit's block does not have",
}


def refusal(name: str) -> str | None:
    """Why `name` (a timm name) is not built here, or None."""
    import fnmatch

    base = name.split(".", 1)[0]
    return next((why for pat, why in REFUSED.items() if fnmatch.fnmatchcase(base, pat)), None)
