"""Hub-free tiny FLUX.2-dev and FLUX.2-klein pipelines (random weights) for CPU tests and smoke runs.

* VAE: ``AutoencoderKLFlux2`` with the real spatial factor 8 (four blocks), 8 base channels and a 4-channel latent
  (the release: 32); its batch-norm running statistics (over the 2x2-patchified 16 channels) are set to fixed
  non-trivial values, so the de-normalisation path is exercised.
* Transformer: ``Flux2Transformer2DModel`` with one double- and one single-stream block, 2 heads of 16, RoPE axes
  (4, 4, 4, 4) (the release: 32 each over 128), ``in_channels`` = 4 x the latent channels (16; the release: 128) and
  ``joint_attention_dim`` = 3 x the text width (three stacked hidden states). dev: ``guidance_embeds=True``;
  klein: ``False``.
* Text: :mod:`flow_grpo.models.tiny_text` (Mistral-3 + Pixtral processor for dev, Qwen3 for klein), as deep as the
  layers the pipelines read.
* Scheduler: the releases' ``FlowMatchEulerDiscreteScheduler`` settings (dynamic shifting, exponential time shift).

At 64 x 64 px the latent is (16, 4, 4): 16 tokens.
"""
from __future__ import annotations

from .tiny_text import mistral3_processor, qwen3_tokenizer, tiny_mistral3, tiny_qwen3

TEXT_HIDDEN = 16


def _vae():
    import torch
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
                             block_out_channels=[8, 16, 16, 16], layers_per_block=1, latent_channels=4,
                             norm_num_groups=8, sample_size=64)
    n = vae.bn.running_mean.numel()
    vae.bn.running_mean.copy_(torch.linspace(-0.3, 0.4, n))
    vae.bn.running_var.copy_(torch.linspace(0.5, 2.0, n))
    return vae


def _transformer(guidance_embeds: bool):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=3 * TEXT_HIDDEN, timestep_guidance_channels=32, mlp_ratio=2.0, axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=guidance_embeds)


def _scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                                           time_shift_type="exponential")


def build_tiny_flux2_pipeline(seed: int = 0):
    import torch
    from diffusers import Flux2Pipeline

    torch.manual_seed(seed)
    proc = mistral3_processor()
    te = tiny_mistral3(proc.tokenizer, num_layers=31, hidden=TEXT_HIDDEN)
    pipe = Flux2Pipeline(scheduler=_scheduler(), vae=_vae(), text_encoder=te, tokenizer=proc,
                         transformer=_transformer(guidance_embeds=True))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_flux2_klein_pipeline(seed: int = 0, is_distilled: bool = False):
    import torch
    from diffusers import Flux2KleinPipeline

    torch.manual_seed(seed)
    tok = qwen3_tokenizer()
    te = tiny_qwen3(tok, num_layers=28, hidden=TEXT_HIDDEN)
    pipe = Flux2KleinPipeline(scheduler=_scheduler(), vae=_vae(), text_encoder=te, tokenizer=tok,
                              transformer=_transformer(guidance_embeds=False), is_distilled=is_distilled)
    pipe.set_progress_bar_config(disable=True)
    return pipe
