"""Hub-free tiny Wan2.1 T2V pipeline (random weights) for CPU tests and smoke runs.

* Text: a tiny ``UMT5EncoderModel`` (Wan2.1's encoder class; the real one is umT5-XXL) with the tiny Unigram
  ``T5TokenizerFast`` of :mod:`flow_grpo.models.tiny`. No installed package ships UMT5's SentencePiece model
  (google/umt5-xxl's ``spiece.model``, 256k pieces) and ``sentencepiece`` is not installed, so the vocabulary is a
  hand-built one; UMT5 uses T5's tokenizer class and id layout (<pad>=0, </s>=1, <unk>=2), which this keeps.
* VAE: ``AutoencoderKLWan`` with the real model's compression (temporal 4, spatial 8: three down-samplings, the
  last two temporal) but 8 base channels and a 4-channel latent whose ``latents_mean``/``latents_std`` are the first
  four of Wan2.1's 16 (so the de-normalisation path is exercised with non-trivial values).
* Transformer: ``WanTransformer3DModel`` with Wan's patch (1, 2, 2), 2 layers, 2 heads of 8.
* Scheduler: ``FlowMatchEulerDiscreteScheduler(shift=3.0)`` (Wan2.1 480p's shift) by default, so the pipeline's
  ``__call__`` is the Euler ODE the adapter's loop reproduces; ``scheduler="unipc"`` gives the released folders'
  ``UniPCMultistepScheduler(use_flow_sigmas=True, flow_shift=3.0, prediction_type="flow_prediction")``.

At 32x32 px and 5 frames the latent is (4, 2, 4, 4): 8 transformer tokens; a 4-step CFG call takes ~0.1 s.
"""
from __future__ import annotations

# first four channels of Wan2.1's VAE statistics (AutoencoderKLWan defaults)
_WAN_MEAN4 = [-0.7571, -0.7089, -0.9113, 0.1075]
_WAN_STD4 = [2.8184, 1.4541, 2.3275, 2.6558]


def build_tiny_wan_pipeline(seed: int = 0, scheduler: str = "euler"):
    import torch
    from diffusers import (AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler, WanPipeline,
                           WanTransformer3DModel)
    from transformers import UMT5Config, UMT5EncoderModel

    from .tiny_tokenizers import build_t5_unigram_tokenizer

    if scheduler not in ("euler", "unipc"):
        raise ValueError(f"scheduler must be 'euler' or 'unipc', got {scheduler!r}")
    torch.manual_seed(seed)
    tok = build_t5_unigram_tokenizer()
    te = UMT5EncoderModel(UMT5Config(
        vocab_size=len(tok), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    ))
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=32,
    )
    vae = AutoencoderKLWan(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=_WAN_MEAN4, latents_std=_WAN_STD4)
    if scheduler == "euler":
        sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    else:
        sched = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0,
                                        num_train_timesteps=1000)
    pipe = WanPipeline(tokenizer=tok, text_encoder=te, transformer=transformer, vae=vae, scheduler=sched)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_wan_i2v_pipeline(seed: int = 0, scheduler: str = "euler"):
    """Tiny Wan2.1 I2V (``WanImageToVideoPipeline``): the T2V components above (same seed, same weights for the
    text encoder and the VAE), a tiny ``CLIPVisionModel`` image encoder (Wan2.1 I2V uses CLIP ViT-H/14's
    penultimate hidden states; here 32 px, patch 8: 17 tokens of width 32) with its ``CLIPImageProcessor``, and a
    transformer with Wan2.1 I2V's input layout: ``in_channels = 2 z + 4`` (noise latents, then the 4-channel
    first-frame mask and the VAE latents of the conditioning video: 4 + 4 + 4 = 12; the release has 16 + 4 + 16),
    ``image_dim`` = the CLIP width and ``added_kv_proj_dim`` = the transformer width (as the release: 5120)."""
    import torch
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    t2v = build_tiny_wan_pipeline(seed, scheduler=scheduler)
    torch.manual_seed(seed + 1)
    image_encoder = CLIPVisionModel(CLIPVisionConfig(
        hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=2, image_size=32,
        patch_size=8, projection_dim=32,
    ))
    processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    z = t2v.vae.config.z_dim
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=2 * z + 4, out_channels=z,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=32, image_dim=32, added_kv_proj_dim=16,
    )
    pipe = WanImageToVideoPipeline(tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, vae=t2v.vae,
                                   scheduler=t2v.scheduler, image_processor=processor, image_encoder=image_encoder,
                                   transformer=transformer)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_wan22_pipeline(seed: int = 0, scheduler: str = "euler", boundary_ratio: float = 0.875):
    """Tiny Wan2.2 A14B T2V (``WanPipeline`` with ``transformer_2`` and ``boundary_ratio``, the T2V release's 0.875):
    the tiny Wan2.1 T2V components (same seed, same weights) plus a second transformer of the same architecture with
    its own weights (seed + 1), the low-noise expert. At 4 Euler steps with shift 3 the timesteps are about 1000,
    858, 602, 9: the first step is the high-noise expert's, the other three the low-noise one's."""
    import torch
    from diffusers import WanPipeline, WanTransformer3DModel

    t2v = build_tiny_wan_pipeline(seed, scheduler=scheduler)
    torch.manual_seed(seed + 1)
    low = WanTransformer3DModel(**{k: v for k, v in t2v.transformer.config.items() if not k.startswith("_")})
    pipe = WanPipeline(tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, transformer=t2v.transformer,
                       vae=t2v.vae, scheduler=t2v.scheduler, transformer_2=low, boundary_ratio=boundary_ratio)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_wan22_ti2v_pipeline(seed: int = 0):
    """Tiny Wan2.2 TI2V-5B (``WanPipeline(expand_timesteps=True)``): the Wan2.2 VAE's layout (``is_residual``, a
    2x2 patchify of RGB into 12 channels, spatial compression 16, temporal 4; the release: 48 latent channels, here
    4 with non-trivial mean/std) and one transformer fed per-token timesteps; the tiny UMT5 text encoder of the T2V
    build. At 64x64 px and 5 frames the latent is (4, 2, 4, 4): 8 tokens."""
    import torch
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    t2v = build_tiny_wan_pipeline(seed)
    torch.manual_seed(seed + 2)
    vae = AutoencoderKLWan(base_dim=8, decoder_base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                           temperal_downsample=[False, True, True], latents_mean=_WAN_MEAN4, latents_std=_WAN_STD4,
                           is_residual=True, in_channels=12, out_channels=12, patch_size=2, scale_factor_spatial=16)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=32,
    )
    pipe = WanPipeline(tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, transformer=transformer, vae=vae,
                       scheduler=t2v.scheduler, expand_timesteps=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_wan22_i2v_pipeline(seed: int = 0, scheduler: str = "euler", boundary_ratio: float = 0.9):
    """Tiny Wan2.2 A14B I2V (``WanImageToVideoPipeline`` with ``transformer_2`` and the I2V release's
    ``boundary_ratio`` 0.9, no CLIP image encoder): the tiny Wan2.1 T2V text encoder, VAE and scheduler, and two
    transformers with Wan2.1 I2V's input layout (``2 z + 4`` channels) but no ``image_dim`` (seeds + 1, + 2)."""
    import torch
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel

    t2v = build_tiny_wan_pipeline(seed, scheduler=scheduler)
    z = t2v.vae.config.z_dim
    experts = []
    for k in (1, 2):
        torch.manual_seed(seed + k)
        experts.append(WanTransformer3DModel(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=2 * z + 4, out_channels=z,
            text_dim=32, freq_dim=32, ffn_dim=32, num_layers=2, rope_max_seq_len=32,
        ))
    pipe = WanImageToVideoPipeline(tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, vae=t2v.vae,
                                   scheduler=t2v.scheduler, transformer=experts[0], transformer_2=experts[1],
                                   boundary_ratio=boundary_ratio)
    pipe.set_progress_bar_config(disable=True)
    return pipe
