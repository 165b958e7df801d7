"""Wan2.1's transformer plus a fixed 3-D sin-cos absolute position embedding (the tiny CPU T2V demo base).

Why: ``WanTransformer3DModel`` sees positions only through RoPE inside self-attention (which depends on the
*offset* between two tokens) and its patch embedding is a convolution with stride = kernel, so the network is
translation-equivariant in (frame, row, column) up to boundary effects. Sampling starts from i.i.d. noise, so such a
model cannot put an object in a given cell of the frame ("moves from left to right" starts on the left) unless it
learns to detect the frame's edges through attention; a large Wan can, the tiny one of the demo does not (its
predicted clip at sigma = 1 is the same in every cell; docs/demo_models.md, "T2V", round 3). SD3, the T2I demo's
base, adds a fixed 2-D sin-cos embedding to its patch tokens; this class does the same in 3-D.

    e(p, n) = [sin(p w_0) .. sin(p w_{n/2-1}), cos(p w_0) .. cos(p w_{n/2-1})],   w_i = 10000^(-i / (n/2))
    pos(f, h, w) = [e(f, n_t), e(h, n_h), e(w, n_w)]   (n_t = width // 8 * 2, n_h = (width - n_t) // 4 * 2,
                                                        n_w = width - n_t - n_h; all even)

added to the patch embedding's output (B, width, F', H', W') at token (f, h, w). The embedding is computed, not
stored: the weights, their names and shapes are exactly ``WanTransformer3DModel``'s.

Loading: ``save_pretrained`` records ``["flow_grpo.models.wan_abspos", "WanAbsPosTransformer3DModel"]`` in the
pipeline's ``model_index.json``; diffusers resolves a non-diffusers library name from the modules the process has
already imported (it never imports a module named by a checkpoint), so import this module before
``WanPipeline.from_pretrained`` (:func:`flow_grpo.models.load_adapter` does).
"""
from __future__ import annotations

import functools

import torch
from diffusers import ModelMixin, WanTransformer3DModel  # noqa: F401 (ModelMixin: see below)

# diffusers' loader looks up its base classes (``ModelMixin``, ...) *in the component's module* to pick the load
# method of a component from outside diffusers, hence the ModelMixin import above.

__all__ = ["sincos_1d", "sincos_3d", "WanAbsPosTransformer3DModel", "ModelMixin"]


def sincos_1d(n: int, dim: int) -> torch.Tensor:
    """(n, dim) float64: row p = ``[sin(p w_i) for i < dim/2] + [cos(p w_i) for i < dim/2]``,
    ``w_i = 10000^(-i / (dim/2))``."""
    if dim % 2:
        raise ValueError(f"dim must be even, got {dim}")
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-torch.arange(dim // 2, dtype=torch.float64) / (dim // 2))
    return torch.cat([(pos * w).sin(), (pos * w).cos()], dim=1)


def sincos_3d(frames: int, height: int, width: int, dim: int) -> torch.Tensor:
    """(dim, frames, height, width) float32: the frame, row and column embeddings of the module docstring,
    stacked along channels in that order."""
    n_t = dim // 8 * 2
    n_h = (dim - n_t) // 4 * 2
    n_w = dim - n_t - n_h
    if min(n_t, n_h, n_w) <= 0 or n_w % 2:
        raise ValueError(f"dim {dim} cannot be split into three even parts")
    et, eh, ew = sincos_1d(frames, n_t), sincos_1d(height, n_h), sincos_1d(width, n_w)
    pe = torch.cat([et[:, None, None, :].expand(frames, height, width, n_t),
                    eh[None, :, None, :].expand(frames, height, width, n_h),
                    ew[None, None, :, :].expand(frames, height, width, n_w)], dim=-1)
    return pe.permute(3, 0, 1, 2).float().contiguous()


class _PatchEmbedAbsPos(torch.nn.Conv3d):
    """Wan's patch embedding (the same ``Conv3d``: same parameters) followed by ``+ sincos_3d`` of its output
    grid."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return y + sincos_3d(*y.shape[2:], y.shape[1]).to(device=y.device, dtype=y.dtype)[None]


class WanAbsPosTransformer3DModel(WanTransformer3DModel):
    """``WanTransformer3DModel`` (same config, weights and forward) whose patch tokens get a fixed 3-D sin-cos
    absolute position embedding (module docstring)."""

    @functools.wraps(WanTransformer3DModel.__init__)  # same signature: diffusers reads the config keys from it
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # swap the class of the existing Conv3d (no new parameters, same state-dict keys)
        self.patch_embedding.__class__ = _PatchEmbedAbsPos
