"""Hub-free tiny LTX-2 text-to-audio+video pipeline (random weights) for CPU tests and smoke runs.

* Text: a narrow ``Gemma3ForConditionalGeneration`` (LTX-2's encoder class; text 2 layers of width 16, a one-layer
  SigLIP tower never used for text) with the tiny ``GemmaTokenizer`` of :mod:`flow_grpo.models.tiny_sana`; the
  ``LTX2TextConnectors`` (video and audio streams, one layer each, no learnable registers) read all 3 hidden states.
* Video VAE: ``AutoencoderKLLTX2Video`` with one spatial down-sampling stage (compression 2 x 1 here; the release:
  32 x 8), 4 latent channels. Audio VAE: ``AutoencoderKLLTX2Audio`` with 2 latent channels over 8 mel bins, and a
  tiny ``LTX2Vocoder`` (the pipeline needs one; the adapter never decodes audio).
* Transformer: ``LTX2VideoTransformer3DModel`` with 2 layers, video 2 heads of 8, audio 2 heads of 4, and
  ``perturbed_attn`` (LTX-2.3's: without it the spatio-temporal guidance pass perturbs nothing).
* Scheduler: ``FlowMatchEulerDiscreteScheduler`` with LTX-2's resolution-dependent shift settings (the pipeline
  passes ``mu``).

At 32 x 32 px and 5 frames the video latent is (4, 5, 16, 16) -> 1280 tokens of 4; at 25 fps the audio latent is 5
frames of 2 x 2 -> 5 tokens of 4.
"""
from __future__ import annotations


def build_tiny_ltx2_pipeline(seed: int = 0):
    import torch
    from diffusers import (AutoencoderKLLTX2Audio, AutoencoderKLLTX2Video, FlowMatchEulerDiscreteScheduler, LTX2Pipeline,
                           LTX2VideoTransformer3DModel)
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from .tiny_sana import gemma_tokenizer

    torch.manual_seed(seed)
    tok = gemma_tokenizer()
    text_cfg = dict(model_type="gemma3_text", vocab_size=len(tok), hidden_size=16, intermediate_size=32,
                    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                    max_position_embeddings=512, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                    eos_token_id=tok.eos_token_id, sliding_window=64)
    vision_cfg = dict(model_type="siglip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, image_size=32, patch_size=8)
    te = Gemma3ForConditionalGeneration(Gemma3Config(text_config=text_cfg, vision_config=vision_cfg,
                                                     mm_tokens_per_image=4, image_token_index=3))
    hidden = te.config.text_config.hidden_size
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, patch_size=1, patch_size_t=1, num_attention_heads=2, attention_head_dim=8,
        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, qk_norm="rms_norm_across_heads",
        caption_channels=hidden, rope_double_precision=False, rope_type="split", perturbed_attn=True)
    connectors = LTX2TextConnectors(
        caption_channels=hidden, text_proj_in_factor=te.config.text_config.num_hidden_layers + 1,
        video_connector_num_attention_heads=4, video_connector_attention_head_dim=4, video_connector_num_layers=1,
        video_connector_num_learnable_registers=None, audio_connector_num_attention_heads=4,
        audio_connector_attention_head_dim=4, audio_connector_num_layers=1, audio_connector_num_learnable_registers=None,
        connector_rope_base_seq_len=32, rope_theta=10000.0, rope_double_precision=False,
        causal_temporal_positioning=False, rope_type="split")
    vae = AutoencoderKLLTX2Video(
        in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(8,), decoder_block_out_channels=(8,),
        layers_per_block=(1,), decoder_layers_per_block=(1, 1), spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,), decoder_inject_noise=(False, False), downsample_type=("spatial",),
        upsample_residual=(False,), upsample_factor=(1,), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False)
    vae.use_framewise_encoding = vae.use_framewise_decoding = False
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, output_channels=2, ch_mult=(1,), num_res_blocks=1, attn_resolutions=None, in_channels=2,
        resolution=32, latent_channels=2, norm_type="pixel", causality_axis="height", dropout=0.0,
        mid_block_add_attention=False, sample_rate=16000, mel_hop_length=160, is_causal=True, mel_bins=8)
    vocoder = LTX2Vocoder(in_channels=2 * 8, hidden_channels=32, out_channels=2, upsample_kernel_sizes=[4, 4],
                          upsample_factors=[2, 2], resnet_kernel_sizes=[3], resnet_dilations=[[1, 3, 5]],
                          leaky_relu_negative_slope=0.1, output_sampling_rate=16000)
    sched = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05,
                                            base_image_seq_len=1024, max_image_seq_len=4096, shift_terminal=0.1)
    pipe = LTX2Pipeline(scheduler=sched, vae=vae, audio_vae=audio_vae, text_encoder=te, tokenizer=tok,
                        connectors=connectors, transformer=transformer, vocoder=vocoder)
    pipe.set_progress_bar_config(disable=True)
    return pipe
