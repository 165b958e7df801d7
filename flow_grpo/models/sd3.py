"""Stable Diffusion 3 / 3.5 adapter (``StableDiffusion3Pipeline`` folder)."""
from __future__ import annotations

import torch

from .base import FlowModelAdapter, PromptEmbeds
from .tiny import (build_tiny_sd3_pipeline, build_tiny_sd3_t5_pipeline, build_tiny_sd3_5_medium_pipeline,
                   build_tiny_sd3_5_large_pipeline)


def _calculate_shift(image_seq_len: int, base_seq_len: int, max_seq_len: int, base_shift: float,
                     max_shift: float) -> float:
    # resolution-dependent shift used by diffusers' flow pipelines (linear in the token count)
    m = (max_shift - base_shift) / (max_seq_len - base_seq_len)
    return image_seq_len * m + (base_shift - m * base_seq_len)


class SD3Adapter(FlowModelAdapter):
    """CFG is one forward pass on [uncond; cond]: ``v = v_u + w (v_c - v_u)``. Timestep fed = 1000 * sigma (fp32)."""

    kind = "sd3"
    pipeline_cls_name = "StableDiffusion3Pipeline"
    tiny = {"sd3": build_tiny_sd3_pipeline,
            "sd3_t5": build_tiny_sd3_t5_pipeline,
            "sd3_5_medium": build_tiny_sd3_5_medium_pipeline,
            "sd3_5_large": build_tiny_sd3_5_large_pipeline}
    evidence = ("tests/flow_grpo/test_models_sd35.py::test_sd35_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer.py::test_each_method_trains_lora",
                "flow, fast, tp_grpo, g2rpo",
                "SD3-medium, SD3.5-medium (MMDiT-X) and SD3.5-large tiny variants; T5 optional")
    release_max_sequence_length = 256  # T5 tokens (StableDiffusion3Pipeline.__call__); CLIP always takes 77

    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:
        pe, npe, pooled, npooled = self.pipe.encode_prompt(
            prompt=prompts, prompt_2=prompts, prompt_3=prompts, device=self.device, num_images_per_prompt=1,
            do_classifier_free_guidance=True, negative_prompt=[""] * len(prompts),
            negative_prompt_2=[""] * len(prompts), negative_prompt_3=[""] * len(prompts),
            max_sequence_length=self.max_sequence_length,
        )
        return PromptEmbeds(prompt_embeds=pe.to(self.dtype), pooled=pooled.to(self.dtype),
                            neg_prompt_embeds=npe.to(self.dtype), neg_pooled=npooled.to(self.dtype))

    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        sched = self._fresh_scheduler()
        kwargs = {}
        if sched.config.get("use_dynamic_shifting", False):
            h, w = self.latent_hw(height, width)
            p = self.transformer.config.patch_size
            kwargs["mu"] = _calculate_shift((h // p) * (w // p), sched.config.get("base_image_seq_len", 256),
                                            sched.config.get("max_image_seq_len", 4096),
                                            sched.config.get("base_shift", 0.5), sched.config.get("max_shift", 1.16))
        sched.set_timesteps(num_steps, device="cpu", **kwargs)
        return sched.sigmas.detach().to(torch.float32).cpu().clone()

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 1.0,
                         cfg: bool = False) -> torch.Tensor:
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        t = self._sigma_vec(sigma, b) * float(self.pipe.scheduler.config.num_train_timesteps)
        x = latents.to(self.dtype)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            out = self.model(
                hidden_states=torch.cat([x, x]), timestep=torch.cat([t, t]),
                encoder_hidden_states=torch.cat([embeds.neg_prompt_embeds, embeds.prompt_embeds]),
                pooled_projections=torch.cat([embeds.neg_pooled, embeds.pooled]), return_dict=False,
            )[0].float()
            v_u, v_c = out.chunk(2)
            return v_u + guidance_scale * (v_c - v_u)
        return self.model(hidden_states=x, timestep=t, encoder_hidden_states=embeds.prompt_embeds,
                          pooled_projections=embeds.pooled, return_dict=False)[0].float()
