"""Hub-free tiny Z-Image pipeline (random weights) for CPU tests and smoke runs.

* Text: a 2-layer ``Qwen3Model`` (Z-Image's encoder class; the release: Qwen3-4B) with the tiny Qwen3 tokenizer of
  :mod:`flow_grpo.models.tiny_text`; the pipeline reads the second-to-last hidden state.
* Transformer: ``ZImageTransformer2DModel`` with patch 2, 2 main layers and 1 refiner layer (noise and context),
  2 heads of 16, RoPE axes (4, 6, 6) over head dim 16, caption width = the text width (16).
* VAE: the FLUX.1-style tiny ``AutoencoderKL`` of :mod:`flow_grpo.models.tiny` (spatial factor 8, shift factor).
* Scheduler: Z-Image-Turbo's ``FlowMatchEulerDiscreteScheduler(shift=3.0)`` (no dynamic shifting).

At 64 x 64 px the latent is (4, 8, 8): 16 image tokens after the 2x2 patchify.
"""
from __future__ import annotations


def build_tiny_z_image_pipeline(seed: int = 0):
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel

    from .tiny_text import _tiny_vae
    from .tiny_text import qwen3_tokenizer, tiny_qwen3

    torch.manual_seed(seed)
    tok = qwen3_tokenizer()
    te = tiny_qwen3(tok, num_layers=2, hidden=16, causal_lm=False)
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2,
        n_kv_heads=2, cap_feat_dim=16, axes_dims=[4, 6, 6], axes_lens=[256, 64, 64])
    pipe = ZImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=_tiny_vae(shift_factor=0.1159),
                          text_encoder=te, tokenizer=tok, transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe
