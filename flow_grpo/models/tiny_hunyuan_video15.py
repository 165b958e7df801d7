"""Hub-free tiny HunyuanVideo 1.5 text-to-video pipeline (random weights) for CPU tests and smoke runs.

* Text: a narrow ``Qwen2_5_VLTextModel`` (hidden 16, 4 layers: the pipeline reads the third-last hidden states)
  with the tiny Qwen tokenizer of :mod:`flow_grpo.models.tiny_text` (ChatML). The pipeline crops the first 108
  tokens (the release tokenizer's system-prompt length); the tiny tokenizer's system prompt is longer, so in the tiny
  the crop keeps its tail too (the computation is the pipeline's either way). Glyph text: a tiny ``T5EncoderModel``
  with ``ByT5Tokenizer`` (byte-level, needs no vocabulary file).
* VAE: ``AutoencoderKLHunyuanVideo15`` with the real compression (spatial 16, temporal 4), 8-16 channels, 4 latent
  channels.
* Transformer: ``HunyuanVideo15Transformer3DModel`` with 2 layers (+1 refiner), 2 heads of 8, RoPE axes (2, 2, 4),
  ``in_channels = 2 C + 1``, image tokens of width 8, ``task_type="t2v"``.
* Scheduler: ``FlowMatchEulerDiscreteScheduler(shift=5.0)``; guider: ``ClassifierFreeGuidance(guidance_scale=6.0)``.

At 64 x 64 px and 5 frames the latent is (4, 2, 4, 4): 32 tokens.
"""
from __future__ import annotations


def _as_saved(tok):
    """The tokenizer as a saved folder reloads it: ``Qwen2Tokenizer.from_pretrained`` rebuilds Qwen's own
    pre-tokeniser, which splits runs of spaces (the release's system prompt has some) differently from the in-memory
    byte-level BPE, so without this the tiny pipeline and its saved folder would tokenise the prompt differently."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tok.save_pretrained(d)
        return type(tok).from_pretrained(d)


def build_tiny_hunyuan_video15_pipeline(seed: int = 0):
    import torch
    from diffusers import (AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
                           HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel)
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    from .tiny_text import qwen3_tokenizer

    torch.manual_seed(seed)
    tok = _as_saved(qwen3_tokenizer())
    te = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=2048, rope_scaling={"type": "mrope", "mrope_section": [1, 1, 2]},
        pad_token_id=tok.pad_token_id))
    tok2 = ByT5Tokenizer()
    te2 = T5EncoderModel(T5Config(vocab_size=len(tok2), d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                                  relative_attention_num_buckets=8, pad_token_id=tok2.pad_token_id,
                                  eos_token_id=tok2.eos_token_id))
    vae = AutoencoderKLHunyuanVideo15(latent_channels=4, block_out_channels=(8, 8, 16, 16, 16), layers_per_block=1)
    transformer = HunyuanVideo15Transformer3DModel(
        in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2, num_refiner_layers=1,
        text_embed_dim=16, text_embed_2_dim=16, image_embed_dim=8, rope_axes_dim=(2, 2, 4), task_type="t2v")
    pipe = HunyuanVideo15Pipeline(text_encoder=te, tokenizer=tok, transformer=transformer, vae=vae,
                                  scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0), text_encoder_2=te2,
                                  tokenizer_2=tok2, guider=ClassifierFreeGuidance(guidance_scale=6.0))
    pipe.set_progress_bar_config(disable=True)
    return pipe
