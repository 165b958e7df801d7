"""Hub-free tiny Qwen-Image and Qwen-Image-Edit pipelines (random weights) for CPU tests and smoke runs.

* Text encoder: the VLM front-end's tiny ``Qwen2_5_VLForConditionalGeneration`` and its tiny Qwen2 tokenizer
  (:func:`mmgrpo.vlm.models.tiny.build_tiny_model`; hidden size 64 = the transformer's ``joint_attention_dim``).
  ``QwenImagePipeline`` drops the first 34 tokens of the encoded chat template (``prompt_template_encode_start_idx``:
  the length of its system prompt under the released Qwen2.5-VL tokenizer); the tiny byte-level BPE splits that
  template into other tokens, so with it the cut falls elsewhere in the template. Adapter and pipeline share
  ``encode_prompt``, so the equality tests are unaffected; only what the tiny text states mean differs.
* VAE: ``AutoencoderKLQwenImage`` with the real compression (spatial 8: three down-samplings), 8 base channels,
  a 4-channel latent whose mean/std are the first four of the released 16.
* Transformer: ``QwenImageTransformer2DModel`` with patch 2 (16 = 4 x 4 input channels), 2 layers, 2 heads of 16,
  RoPE axes (4, 6, 6).
* Scheduler: Qwen/Qwen-Image's ``FlowMatchEulerDiscreteScheduler`` config (dynamic exponential shift with
  base/max shift 0.5/0.9 over 256..8192 tokens, ``shift_terminal`` 0.02), for both pipelines (a real
  Qwen-Image-Edit folder's own scheduler config is what the adapter reads).
* Qwen-Image-Edit: the same components plus the tiny Qwen2.5-VL processor (its image processor's small pixel
  bounds keep the reference image's vision tokens few); ``QwenImageEditPipeline`` drops the first 64 tokens of its
  template (the released tokenizer's system prompt), which again falls elsewhere under the tiny tokenizer.
"""
from __future__ import annotations

_MEAN4 = [-0.7571, -0.7089, -0.9113, 0.1075]
_STD4 = [2.8184, 1.4541, 2.3275, 2.6558]
QWEN_IMAGE_SCHEDULER = dict(
    num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
    base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential",
)


def build_tiny_qwen_image_pipeline(seed: int = 0):
    from diffusers import QwenImagePipeline

    parts = _tiny_parts(seed)
    parts.pop("processor")
    pipe = QwenImagePipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def build_tiny_qwen_image_edit_pipeline(seed: int = 0):
    """``QwenImageEditPipeline`` over the same components (same seed, same weights) plus the tiny Qwen2.5-VL
    processor: Qwen-Image-Edit feeds the reference image to the text encoder through it (vision tokens)."""
    from diffusers import QwenImageEditPipeline
    from transformers import Qwen2VLProcessor

    parts = _tiny_parts(seed)
    p = parts["processor"]  # the pipeline's declared class (same image processing as Qwen2.5-VL's for images)
    parts["processor"] = Qwen2VLProcessor(image_processor=p.image_processor, tokenizer=p.tokenizer,
                                          video_processor=p.video_processor)
    pipe = QwenImageEditPipeline(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _tiny_parts(seed: int) -> dict:
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    from mmgrpo.vlm.models.tiny import build_tiny_model

    text_encoder, processor = build_tiny_model("qwen2_5_vl", seed=seed)
    torch.manual_seed(seed)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=text_encoder.config.text_config.hidden_size, guidance_embeds=False,
        axes_dims_rope=(4, 6, 6),
    )
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                 temperal_downsample=[False, True, True], latents_mean=_MEAN4, latents_std=_STD4)
    return dict(scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER), vae=vae, text_encoder=text_encoder,
                tokenizer=processor.tokenizer, processor=processor, transformer=transformer)
