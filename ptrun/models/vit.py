"""timm VisionTransformer adapter: embed | (attention half, MLP half) x L | norm + head.

The units mirror timm 1.0's `VisionTransformer.forward_features` / `forward_head` and `Block.forward`
(without an attention mask, as `VisionTransformer.forward` runs by default). Token assembly and pooling are
timm's own methods called with the unit as `self` (the unit carries the attributes they read), so cls/reg
tokens, `no_embed_class`, dynamic image size and every pooling type behave exactly as in timm.
"""

from __future__ import annotations

import torch
from torch import nn

from ptrun.config import ConfigError, ModelConfig
from ptrun.installed import hidden
from ptrun.models.layered import LayeredModel

# timm imports wandb whenever it is installed (timm.utils.summary, for a logging option ptrun never uses). Next
# to torch and transformers that import took 13-16 s here (pydantic inspects every loaded module), in every
# worker at every start and restart. ptrun's own wandb tracker (logger=wandb) imports it when asked.
with hidden("wandb"):
    import timm
    from timm.layers import trunc_normal_
    from timm.models._manipulate import named_apply
    from timm.models.vision_transformer import Block, VisionTransformer, init_weights_vit_timm


class VitEmbed(nn.Module):
    """patch_embed -> cls/reg tokens + pos_embed -> pos_drop -> patch_drop -> norm_pre."""

    def __init__(self, vit: VisionTransformer) -> None:
        super().__init__()
        self.patch_embed, self.pos_drop = vit.patch_embed, vit.pos_drop
        self.patch_drop, self.norm_pre = vit.patch_drop, vit.norm_pre
        # The very Parameter objects of the VisionTransformer (or None), so they are owned by this unit.
        self.cls_token, self.reg_token, self.pos_embed = vit.cls_token, vit.reg_token, vit.pos_embed
        self.num_prefix_tokens = vit.num_prefix_tokens
        self.no_embed_class = vit.no_embed_class
        self.dynamic_img_size = vit.dynamic_img_size

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = VisionTransformer._pos_embed(self, self.patch_embed(pixel_values))  # type: ignore[arg-type]
        return self.norm_pre(self.patch_drop(x))


class VitBlockHalf(nn.Module):
    """One residual half of a pre-norm Block: x + drop_path1(ls1(attn(norm1(x)))) (`half` 1) or
    x + drop_path2(ls2(mlp(norm2(x)))) (`half` 2), its submodules under the block's own names."""

    def __init__(self, block: Block, half: int) -> None:
        super().__init__()
        self.parts = (f"norm{half}", "attn" if half == 1 else "mlp", f"ls{half}", f"drop_path{half}")
        for name in self.parts:
            setattr(self, name, getattr(block, name))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, inner, ls, drop_path = (getattr(self, name) for name in self.parts)
        return x + drop_path(ls(inner(norm(x))))


class VitHead(nn.Module):
    """norm -> pool -> fc_norm -> head_drop -> head."""

    def __init__(self, vit: VisionTransformer) -> None:
        super().__init__()
        self.norm, self.attn_pool, self.fc_norm = vit.norm, vit.attn_pool, vit.fc_norm
        self.head_drop, self.head = vit.head_drop, vit.head
        self.global_pool = vit.global_pool
        self.num_prefix_tokens = vit.num_prefix_tokens
        self.pool_include_prefix = vit.pool_include_prefix

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = VisionTransformer.pool(self, self.norm(x))  # type: ignore[arg-type]
        return self.head(self.head_drop(self.fc_norm(x)))


def init_vit_unit(unit: nn.Module) -> None:
    """timm's own initialisation (`VisionTransformer.init_weights`, mode ''), restricted to one unit: each
    Linear truncated-normal (std 0.02) with zero bias, other modules their `reset_parameters`; the embedding's
    position embedding truncated-normal and its class / register tokens normal (std 1e-6)."""
    named_apply(init_weights_vit_timm, unit)
    if isinstance(unit, VitEmbed):
        if unit.pos_embed is not None:
            trunc_normal_(unit.pos_embed, std=0.02)
        for token in (unit.cls_token, unit.reg_token):
            if token is not None:
                nn.init.normal_(token, std=1e-6)


def build_vit(cfg: ModelConfig, *, num_classes: int, img_size: int | None, in_chans: int | None) -> LayeredModel:
    """`timm.create_model(cfg.name, pretrained=False, ...)` with only the sizes that are set."""
    if not timm.is_model(cfg.name):
        raise ConfigError(
            f"model.name={cfg.name!r} is not a known model: use a timm vit_*/deit_* name "
            f"(e.g. vit_tiny_patch16_224) or a BERT name"
        )
    if cfg.task != "classification":
        raise ConfigError(f"model.task={cfg.task!r} is not allowed: ViT supports classification only")
    kwargs = dict(
        num_classes=cfg.num_classes or num_classes,
        img_size=cfg.img_size or img_size,
        patch_size=cfg.patch_size,
        in_chans=cfg.in_chans or in_chans,
        embed_dim=cfg.embed_dim,
        depth=cfg.depth,
        num_heads=cfg.num_heads,
        mlp_ratio=cfg.mlp_ratio,
        drop_rate=cfg.dropout,
        drop_path_rate=cfg.drop_path,
    )
    vit = timm.create_model(cfg.name, pretrained=False, **{k: v for k, v in kwargs.items() if v is not None})
    # Units mirror these two classes exactly; subclasses (e.g. distilled DeiT) and other blocks differ.
    if type(vit) is not VisionTransformer or any(type(b).forward is not Block.forward for b in vit.blocks):
        raise ConfigError(
            f"model.name={cfg.name!r} is not a known model: ptrun supports timm "
            f"VisionTransformer with pre-norm Blocks, this is a {type(vit).__name__}"
        )
    units: list[nn.Module] = [VitEmbed(vit)]
    for block in vit.blocks:
        units += [VitBlockHalf(block, 1), VitBlockHalf(block, 2)]
    units.append(VitHead(vit))
    layered = LayeredModel(
        vit, family="vit", task="classification", units=units, input_names=("pixel_values",), init=init_vit_unit
    )
    layered.library_config = {"model_name": cfg.name, **{k: v for k, v in kwargs.items() if v is not None}}
    return layered
