"""Hub-free tiny SD3 / SD3+T5 / FLUX / FLUX-Kontext pipelines (random weights, built from configs) for CPU tests and
smoke runs.

Tokenizers: :mod:`flow_grpo.models.tiny_tokenizers`.

The configs are small combinations checked to build and run on CPU (tests/flow_grpo/test_models.py).
"""
from __future__ import annotations

from typing import Any, Optional

from .tiny_text import _tiny_vae
from .tiny_tokenizers import build_clip_tokenizer, build_t5_tokenizer, build_t5_unigram_tokenizer

def _tiny_t5_encoder(tok, d_model: int):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(
        vocab_size=len(tok), d_model=d_model, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
        decoder_start_token_id=tok.pad_token_id,
    ))


def _clip_text_config(vocab_size: int, tok, hidden: int, proj: int):
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=4, max_position_embeddings=77, projection_dim=proj,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )


def build_tiny_sd3_pipeline(seed: int = 0, with_t5: bool = False, num_layers: int = 2, qk_norm: Optional[str] = None,
                            dual_attention_layers: tuple[int, ...] = ()):
    """StableDiffusion3Pipeline with two tiny CLIP-with-projection encoders; no T5 (``text_encoder_3=None``) unless
    ``with_t5``: then a tiny ``T5EncoderModel`` whose d_model is the transformer's ``joint_attention_dim`` (64 here;
    in SD3.5 both are T5-XXL's 4096) and a Unigram ``T5TokenizerFast``. The T5 parts are built last, so every other component is
    the same as without T5 for the same seed. ``num_layers`` / ``qk_norm`` / ``dual_attention_layers``: the
    transformer options that tell the SD3 releases apart (SD3-medium: none; SD3.5-large: ``qk_norm="rms_norm"``, 38
    layers; SD3.5-medium: also MMDiT-X's extra self-attention in ``dual_attention_layers`` 0-12)."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    torch.manual_seed(seed)
    tok = build_clip_tokenizer()
    tok2 = build_clip_tokenizer()
    te = CLIPTextModelWithProjection(_clip_text_config(len(tok), tok, 32, 32))
    te2 = CLIPTextModelWithProjection(_clip_text_config(len(tok2), tok2, 32, 32))
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, num_layers=num_layers, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=64, caption_projection_dim=32, pooled_projection_dim=64, out_channels=4, qk_norm=qk_norm,
        dual_attention_layers=tuple(dual_attention_layers),
    )
    vae = _tiny_vae(shift_factor=0.0609)
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    te3 = tok3 = None
    if with_t5:
        tok3 = build_t5_unigram_tokenizer()
        te3 = _tiny_t5_encoder(tok3, transformer.config.joint_attention_dim)
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=scheduler, vae=vae, text_encoder=te, tokenizer=tok,
        text_encoder_2=te2, tokenizer_2=tok2, text_encoder_3=te3, tokenizer_3=tok3,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_flux_pipeline(seed: int = 0, guidance_embeds: bool = True):
    """FluxPipeline with a tiny CLIP (pooled) + tiny T5 (sequence) and a guidance-distilled tiny transformer."""
    import torch
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    torch.manual_seed(seed)
    tok = build_clip_tokenizer()
    t5_tok = build_t5_tokenizer()
    te = CLIPTextModel(_clip_text_config(len(tok), tok, 32, 32))
    te2 = _tiny_t5_encoder(t5_tok, 32)
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=guidance_embeds,
        axes_dims_rope=[4, 6, 6],
    )
    vae = _tiny_vae(shift_factor=0.1159)
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    pipe = FluxPipeline(
        scheduler=scheduler, vae=vae, text_encoder=te, tokenizer=tok, text_encoder_2=te2, tokenizer_2=t5_tok,
        transformer=transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_sd3_t5_pipeline(seed: int = 0):
    """The tiny SD3 with its T5 text encoder (``text_encoder_3``), like SD3.5's CLIP-L + CLIP-G + T5-XXL."""
    return build_tiny_sd3_pipeline(seed, with_t5=True)


def build_tiny_sd3_5_large_pipeline(seed: int = 0):
    """SD3.5-large's transformer options on the tiny SD3 + T5: RMS q/k norms in every block, no MMDiT-X layers, 3
    layers (the release: 38 of 38 heads x 64; the adapter is the ``sd3`` one, nothing else differs)."""
    return build_tiny_sd3_pipeline(seed, with_t5=True, num_layers=3, qk_norm="rms_norm")


def build_tiny_sd3_5_medium_pipeline(seed: int = 0):
    """SD3.5-medium's options on the tiny SD3 + T5: RMS q/k norms and MMDiT-X's second self-attention in the first
    block (``dual_attention_layers``; the release: blocks 0-12 of 24)."""
    return build_tiny_sd3_pipeline(seed, with_t5=True, num_layers=2, qk_norm="rms_norm", dual_attention_layers=(0,))


def build_tiny_flux_kontext_pipeline(seed: int = 0, guidance_embeds: bool = True):
    """FluxKontextPipeline over the tiny FLUX components (same weights as ``build_tiny_flux_pipeline(seed)``):
    Kontext is the FLUX architecture fed reference-image tokens, so no new module is needed."""
    from diffusers import FluxKontextPipeline

    flux = build_tiny_flux_pipeline(seed, guidance_embeds=guidance_embeds)
    pipe = FluxKontextPipeline(
        scheduler=flux.scheduler, vae=flux.vae, text_encoder=flux.text_encoder, tokenizer=flux.tokenizer,
        text_encoder_2=flux.text_encoder_2, tokenizer_2=flux.tokenizer_2, transformer=flux.transformer,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_wan_pipeline(seed: int = 0, **kwargs):
    """Tiny Wan2.1 T2V pipeline (see :mod:`flow_grpo.models.tiny_wan`)."""
    from .tiny_wan import build_tiny_wan_pipeline as build

    return build(seed, **kwargs)


def build_tiny_sana_pipeline(seed: int = 0):
    """Tiny SANA pipeline (see :mod:`flow_grpo.models.tiny_sana`)."""
    from .tiny_sana import build_tiny_sana_pipeline as build

    return build(seed)


def build_tiny_hunyuan_video15_pipeline(seed: int = 0):
    """Tiny HunyuanVideo 1.5 T2V pipeline (see :mod:`flow_grpo.models.tiny_hunyuan_video15`)."""
    from .tiny_hunyuan_video15 import build_tiny_hunyuan_video15_pipeline as build

    return build(seed)


def build_tiny_ltx2_pipeline(seed: int = 0):
    """Tiny LTX-2 audio+video pipeline (see :mod:`flow_grpo.models.tiny_ltx2`)."""
    from .tiny_ltx2 import build_tiny_ltx2_pipeline as build

    return build(seed)


def build_tiny_wan22_pipeline(seed: int = 0, **kwargs):
    """Tiny Wan2.2 A14B T2V, two experts (see :func:`flow_grpo.models.tiny_wan.build_tiny_wan22_pipeline`)."""
    from .tiny_wan import build_tiny_wan22_pipeline as build

    return build(seed, **kwargs)


def build_tiny_wan22_ti2v_pipeline(seed: int = 0):
    """Tiny Wan2.2 TI2V-5B (see :func:`flow_grpo.models.tiny_wan.build_tiny_wan22_ti2v_pipeline`)."""
    from .tiny_wan import build_tiny_wan22_ti2v_pipeline as build

    return build(seed)


def build_tiny_wan22_i2v_pipeline(seed: int = 0, **kwargs):
    """Tiny Wan2.2 A14B I2V (see :func:`flow_grpo.models.tiny_wan.build_tiny_wan22_i2v_pipeline`)."""
    from .tiny_wan import build_tiny_wan22_i2v_pipeline as build

    return build(seed, **kwargs)


def build_tiny_wan_i2v_pipeline(seed: int = 0, **kwargs):
    """Tiny Wan2.1 I2V pipeline (see :func:`flow_grpo.models.tiny_wan.build_tiny_wan_i2v_pipeline`)."""
    from .tiny_wan import build_tiny_wan_i2v_pipeline as build

    return build(seed, **kwargs)


def build_tiny_qwen_image_pipeline(seed: int = 0):
    """Tiny Qwen-Image pipeline (see :mod:`flow_grpo.models.tiny_qwen_image`)."""
    from .tiny_qwen_image import build_tiny_qwen_image_pipeline as build

    return build(seed)


def build_tiny_qwen_image_edit_pipeline(seed: int = 0):
    """Tiny Qwen-Image-Edit pipeline (see :mod:`flow_grpo.models.tiny_qwen_image`)."""
    from .tiny_qwen_image import build_tiny_qwen_image_edit_pipeline as build

    return build(seed)


def build_tiny_flux2_pipeline(seed: int = 0):
    """Tiny FLUX.2-dev pipeline (see :mod:`flow_grpo.models.tiny_flux2`)."""
    from .tiny_flux2 import build_tiny_flux2_pipeline as build

    return build(seed)


def build_tiny_flux2_klein_pipeline(seed: int = 0, **kwargs):
    """Tiny FLUX.2-klein pipeline (see :mod:`flow_grpo.models.tiny_flux2`)."""
    from .tiny_flux2 import build_tiny_flux2_klein_pipeline as build

    return build(seed, **kwargs)


def build_tiny_z_image_pipeline(seed: int = 0):
    """Tiny Z-Image pipeline (see :mod:`flow_grpo.models.tiny_z_image`)."""
    from .tiny_z_image import build_tiny_z_image_pipeline as build

    return build(seed)


def build_tiny_qwen_image21_pipeline(seed: int = 0):
    """Tiny Qwen-Image 2.1 pipeline (see :mod:`flow_grpo.models.tiny_qwen_image21`)."""
    from .tiny_qwen_image21 import build_tiny_qwen_image21_pipeline as build

    return build(seed)
