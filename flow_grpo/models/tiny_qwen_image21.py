"""Hub-free tiny Qwen-Image 2.1 pipeline (random weights) for CPU tests and smoke runs.

* Text: the VLM front-end's tiny ``Qwen3VLForConditionalGeneration`` and ``Qwen3VLProcessor`` (Qwen-Image 2.1's
  encoder classes; hidden size 64 = the transformer's ``context_in_dim``). The pipeline drops the tokens of its
  tokenised system message (``_drop_idx``), counted with whatever tokenizer the folder has, so the tiny byte-level
  BPE drops its own count (47) rather than the released tokenizer's.
* VAE: ``AutoencoderKLQwenImage21`` with the real compression (spatial 16: four down-samplings) and RGBA in/out, 8
  base channels and a 4-channel latent (the release: 64) with fixed non-trivial mean/std.
* Transformer: ``QwenImage21Transformer2DModel`` with patch 1 (unpatched latents, as the release), 2 layers, 2 heads
  of 16, RoPE axes (4, 6, 6), ``causal_condition`` (the release's default).
* Scheduler: ``FlowMatchEulerDiscreteScheduler`` with dynamic exponential shifting (the adapter reads whatever the
  folder's is).

At 64 x 64 px the latent is (4, 4, 4): 16 tokens.
"""
from __future__ import annotations

_MEAN4 = [-0.1, 0.2, 0.05, 0.3]
_STD4 = [1.5, 0.8, 1.2, 2.0]


def build_tiny_qwen_image21_pipeline(seed: int = 0):
    import torch
    from diffusers import (AutoencoderKLQwenImage21, FlowMatchEulerDiscreteScheduler, QwenImage21Pipeline,
                           QwenImage21Transformer2DModel)

    from .tiny_text import tiny_qwen3_vl

    text_encoder, processor = tiny_qwen3_vl(seed)
    torch.manual_seed(seed)
    transformer = QwenImage21Transformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        context_in_dim=text_encoder.config.text_config.hidden_size, axes_dims_rope=(4, 6, 6))
    vae = AutoencoderKLQwenImage21(base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1, 1], num_res_blocks=1,
                                   latents_mean=_MEAN4, latents_std=_STD4)
    sched = FlowMatchEulerDiscreteScheduler(shift=1.0, use_dynamic_shifting=True, time_shift_type="exponential")
    pipe = QwenImage21Pipeline(scheduler=sched, vae=vae, text_encoder=text_encoder, processor=processor,
                               transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe
