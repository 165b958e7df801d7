"""Model adapter base: everything the sampler/trainer needs from a flow-matching text-to-image pipeline.

An adapter wraps a diffusers pipeline (loaded with ``from_pretrained``, the same path a 12B checkpoint takes) and
exposes a small, explicit interface:

* ``encode_prompts(prompts) -> PromptEmbeds``  (cached by prompt string; text encoders are frozen)
* ``initial_noise(seeds, height, width) -> latents``  (one ``torch.Generator`` per sample, explicit seeds)
* ``predict_velocity(latents, sigma, embeds, guidance_scale, cfg) -> v``  (sigma: float or (B,) tensor in [0, 1])
* ``sigmas(num_steps, height, width) -> (K+1,) tensor``  (from a *fresh* copy of the pipeline's scheduler)
* ``decode(latents) -> uint8 NHWC``
* LoRA / full fine-tune setup, gradient checkpointing, reference policy (``reference()`` context = LoRA disabled).

"Model-space" latents are what the transformer consumes: (B, C, h, w) for SD3 and packed tokens (B, L, 4C) for FLUX.
The SDE kernel is elementwise, so the sampler never needs to know the layout.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Iterator, Optional, Sequence

import torch


def shifted_scheduler_config(conf: dict, shift: float) -> dict:
    """A flow-matching scheduler config with the fixed time shift ``shift`` (FlowMatchEulerDiscreteScheduler:
    ``shift`` and no dynamic shifting; UniPC with flow sigmas: ``flow_shift``)."""
    conf = dict(conf)
    if conf.get("use_flow_sigmas") or "flow_shift" in conf:
        conf["flow_shift"] = float(shift)
    else:
        conf["shift"] = float(shift)
    if "use_dynamic_shifting" in conf:
        conf["use_dynamic_shifting"] = False
    return conf


@dataclass
class PromptEmbeds:
    """Conditioning for a batch. ``prompt_embeds`` (B, L, D), ``pooled`` (B, P) (None for models without a pooled
    embedding: Wan, Qwen-Image); ``neg_*`` the unconditional (empty-prompt) embeddings for CFG (or None);
    ``text_ids`` (L, 3) for FLUX (shared by the batch); ``cond_latents`` (B, C, h', w') the VAE latents of a
    per-sample reference image (FLUX-Kontext), or None; ``prompt_mask`` / ``neg_prompt_mask`` (B, L) the valid text
    tokens of zero-padded embeddings (Qwen-Image), or None (all valid); ``image_embeds`` (B, L', D') a per-sample
    reference image's encoder states (Wan2.1 I2V: CLIP vision), or None; ``prompt_embeds_2`` / ``prompt_mask_2`` (and
    ``neg_*_2``) a second text sequence of another width with its mask (HunyuanVideo 1.5: the ByT5 glyph text), or
    None."""

    prompt_embeds: torch.Tensor
    pooled: torch.Tensor
    neg_prompt_embeds: Optional[torch.Tensor] = None
    neg_pooled: Optional[torch.Tensor] = None
    text_ids: Optional[torch.Tensor] = None
    cond_latents: Optional[torch.Tensor] = None
    prompt_mask: Optional[torch.Tensor] = None
    neg_prompt_mask: Optional[torch.Tensor] = None
    image_embeds: Optional[torch.Tensor] = None
    prompt_embeds_2: Optional[torch.Tensor] = None
    prompt_mask_2: Optional[torch.Tensor] = None
    neg_prompt_embeds_2: Optional[torch.Tensor] = None
    neg_prompt_mask_2: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return self.prompt_embeds.shape[0]

    def index(self, idx) -> "PromptEmbeds":
        """Select rows (``idx``: slice, list or LongTensor)."""
        if isinstance(idx, list):
            idx = torch.as_tensor(idx, dtype=torch.long, device=self.prompt_embeds.device)
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v if (v is None or f.name == "text_ids") else v[idx]
        return PromptEmbeds(**out)

    @staticmethod
    def cat(items: Sequence["PromptEmbeds"]) -> "PromptEmbeds":
        out = {}
        for f in fields(PromptEmbeds):
            vals = [getattr(e, f.name) for e in items]
            if vals[0] is None:
                out[f.name] = None
            elif f.name == "text_ids":
                out[f.name] = vals[0]
            else:
                out[f.name] = torch.cat(vals, 0)
        return PromptEmbeds(**out)


DEFAULT_LORA_TARGETS = (
    "to_q", "to_k", "to_v", "to_out.0",
    "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
)


class FlowModelAdapter:
    """Base class; subclasses implement the architecture-specific parts (see module docstring)."""

    kind: str = "base"
    pipeline_cls_name: str = ""
    # declared by each registered class itself (read with vars(cls), never inherited; flow_grpo.models collects them):
    # tiny: its hub-free tiny random pipelines for tests and `model.tiny=<name>` smoke runs, {name: builder(seed=0)};
    # evidence: (pipeline-equality test "file::function", trainer test "file::function", the methods a test trains it
    # with, notes) for the support matrix of docs/generators.md (flow_grpo.models.support)
    tiny: ClassVar[dict[str, Callable[..., Any]]] = {}
    evidence: ClassVar[tuple[str, str, str, str]] = ("", "", "", "")
    # T5 tokens the release's pipeline encodes by default (diffusers' __call__ default); the padded length is
    # part of the conditioning (FLUX attention has no text mask), so training and sampling must agree with it
    release_max_sequence_length: int = 256
    # False for guidance-distilled models (FLUX, FLUX-Kontext: the guidance scale is an input, no CFG branch)
    supports_cfg: bool = True
    # what ``decode`` returns: "image" uint8 (B, H, W, 3) or "video" uint8 (B, F, H, W, 3) (flow_grpo.media)
    media: str = "image"
    # sample.shift: an explicit flow-matching shift replacing the folder scheduler's (None = the folder's)
    shift_override: Optional[float] = None

    def __init__(self, pipe, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                 max_sequence_length: int | None = None):
        self.pipe = pipe
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_sequence_length = int(max_sequence_length or self.release_max_sequence_length)
        self.transformer = pipe.transformer
        # ``model`` is what forward passes go through; a trainer may replace it with a DDP/accelerate wrapper.
        self.model = self.transformer
        self.vae = pipe.vae
        self._embed_cache: dict[str, PromptEmbeds] = {}
        self._neg: tuple[torch.Tensor, torch.Tensor] | None = None  # see _embeds_with_negative
        self.lora_enabled = False
        pipe.to(self.device)
        if self.transformer.dtype != dtype:
            self.transformer.to(dtype=dtype)
        for module in self._frozen_modules():
            module.requires_grad_(False)
            module.eval()
        self.transformer.requires_grad_(False)
        self._set_sdpa()

    # ----------------------------------------------------------------- setup
    def _frozen_modules(self) -> list[torch.nn.Module]:
        mods = [self.vae]
        for name in ("text_encoder", "text_encoder_2", "text_encoder_3"):
            m = getattr(self.pipe, name, None)
            if m is not None:
                mods.append(m)
        return mods

    def _set_sdpa(self) -> None:
        """SDPA is diffusers' default attention processor; xformers only if importable AND on CUDA."""
        if self.device.type != "cuda":
            return
        try:
            import xformers  # noqa: F401
        except ImportError:
            return
        try:
            self.transformer.enable_xformers_memory_efficient_attention()
        except Exception:  # pragma: no cover - GPU only; SDPA stays in place
            pass

    def add_lora(self, rank: int = 32, alpha: float = 64.0, target_modules: Sequence[str] = DEFAULT_LORA_TARGETS,
                 init_lora_weights="gaussian", dropout: float = 0.0) -> list[torch.nn.Parameter]:
        """Attach a peft LoRA (adapter name 'default') to the transformer; only LoRA params are trainable.

        ``target_modules`` names that do not exist in the architecture are skipped (e.g. SD3's last block has
        no ``to_add_out``); an empty match raises."""
        from peft import LoraConfig

        present = {n.split(".")[-1] for n, _ in self.transformer.named_modules()}
        present |= {".".join(n.split(".")[-2:]) for n, _ in self.transformer.named_modules()}
        present |= {n for n, _ in self.transformer.named_modules()}  # full module paths (LTX-2's video stream)
        targets = [t for t in target_modules if t in present]
        if not targets:
            raise ValueError(f"none of the LoRA target_modules {list(target_modules)} exist in {type(self.transformer).__name__}")
        cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=init_lora_weights,
                         lora_dropout=dropout)
        self.transformer.add_adapter(cfg)
        self.lora_enabled = True
        params = [p for n, p in self.transformer.named_parameters() if "lora_" in n]
        for p in params:
            p.data = p.data.float()  # trainable weights in fp32 even if the base model is half precision
            p.requires_grad_(True)
        return params

    def enable_full_finetune(self) -> list[torch.nn.Parameter]:
        self.transformer.requires_grad_(True)
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        if enabled:
            self.transformer.enable_gradient_checkpointing()
        elif getattr(self.transformer, "is_gradient_checkpointing", False):
            self.transformer.disable_gradient_checkpointing()

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """Reference policy: the base model, i.e. the LoRA adapter disabled. Without LoRA (full fine-tune)
        a frozen copy must be provided by the caller (``ref_transformer``)."""
        if not self.lora_enabled:
            raise RuntimeError("reference(): no LoRA adapter; full fine-tuning needs an explicit reference model")
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self.transformer.enable_adapters()

    # ----------------------------------------------------------------- prompts
    def _encode_uncached(self, prompts: list[str]) -> PromptEmbeds:  # pragma: no cover - abstract
        raise NotImplementedError

    @torch.no_grad()
    def encode_prompts(self, prompts: Sequence[str]) -> PromptEmbeds:
        """(B,...) embeddings for ``prompts``; each distinct string is encoded once and cached (the same tensors are
        then reused by sampling and training, which keeps the on-policy ratio exactly 1)."""
        prompts = list(prompts)
        missing = list(dict.fromkeys(p for p in prompts if p not in self._embed_cache))
        # one prompt per text-encoder call: an embedding must not depend on which batch first met the prompt
        # (batch-size-dependent kernels would otherwise make runs depend on data order / process count)
        for p in missing:
            self._embed_cache[p] = self._encode_uncached([p])
        return PromptEmbeds.cat([self._embed_cache[p] for p in prompts])

    def clear_prompt_cache(self) -> None:
        self._embed_cache.clear()
        self._neg = None

    def _embeds_with_negative(self, prompt: str) -> PromptEmbeds:
        """One prompt's masked embeddings and the negative prompt's, for adapters whose ``_encode_one(prompt)``
        returns ``(embeds, mask)``; the negative prompt is encoded once until the prompt cache is cleared."""
        pe, mask = self._encode_one(prompt)
        if self._neg is None:
            self._neg = self._encode_one(self.negative_prompt)
        npe, nmask = self._neg
        return PromptEmbeds(prompt_embeds=pe, pooled=None, neg_prompt_embeds=npe, prompt_mask=mask,
                            neg_prompt_mask=nmask)

    # ----------------------------------------------------------------- latents
    def latent_hw(self, height: int, width: int) -> tuple[int, int]:
        f = self.pipe.vae_scale_factor
        if height % f or width % f:
            raise ValueError(f"height/width ({height}, {width}) must be divisible by the VAE scale factor {f}")
        return height // f, width // f

    def noise_shape(self, height: int, width: int) -> tuple[int, ...]:
        h, w = self.latent_hw(height, width)
        return (self.transformer.config.in_channels, h, w)

    def initial_noise(self, seeds: Sequence[int], height: int, width: int) -> torch.Tensor:
        """x_T: one CPU ``torch.Generator`` per sample seeded with ``seeds[i]`` (device-independent values),
        returned in model space (fp32)."""
        shape = self.noise_shape(height, width)
        noise = torch.stack([
            torch.randn(shape, generator=torch.Generator().manual_seed(int(s) % 2**63), dtype=torch.float32)
            for s in seeds
        ]).to(self.device)
        return self.pack(noise)

    def set_resolution(self, height: int, width: int) -> None:
        """Tell the adapter the image size of the next forward passes (FLUX needs it for img_ids)."""

    def pack(self, latents: torch.Tensor) -> torch.Tensor:
        return latents

    def unpack(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return latents

    # ----------------------------------------------------------------- schedule
    def set_shift(self, shift: Optional[float]) -> None:
        """Override the folder scheduler's flow-matching shift (``sample.shift``; None = the folder's)."""
        if shift is not None and not float(shift) > 0:
            raise ValueError(f"sample.shift must be > 0 (or None = the folder scheduler's), got {shift}")
        self.shift_override = None if shift is None else float(shift)

    def _fresh_scheduler(self):
        """A copy of the pipeline's scheduler: computing sigmas never mutates shared scheduler state. With
        :meth:`set_shift` the copy uses the fixed shift ``s`` instead (``sigma' = s sigma / (1 + (s - 1) sigma)``):
        resolution-dependent shifting is turned off (FLUX / Qwen-Image folders use it), UniPC's ``flow_shift``
        (Wan folders) is set to ``s``; anything else of the folder's scheduler (e.g. ``shift_terminal``) is kept."""
        conf = copy.deepcopy(dict(self.pipe.scheduler.config))
        if self.shift_override is not None:
            conf = shifted_scheduler_config(conf, self.shift_override)
        return type(self.pipe.scheduler).from_config(conf)

    def sigmas(self, num_steps: int, height: int, width: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # ----------------------------------------------------------------- model
    def predict_velocity(self, latents: torch.Tensor, sigma, embeds: PromptEmbeds, guidance_scale: float = 1.0,
                         cfg: bool = False) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def _sigma_vec(self, sigma, batch: int) -> torch.Tensor:
        s = torch.as_tensor(sigma, dtype=torch.float32, device=self.device)
        if s.ndim == 0:
            s = s.expand(batch)
        if s.shape != (batch,):
            raise ValueError(f"sigma must be a float or a ({batch},) tensor, got shape {tuple(s.shape)}")
        return s

    # ----------------------------------------------------------------- decode
    @torch.no_grad()
    def decode(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Model-space latents -> uint8 images (B, H, W, 3) using the VAE config's scaling/shift factors."""
        lat = self.unpack(latents, height, width).to(self.vae.dtype)
        cfg = self.vae.config
        shift = getattr(cfg, "shift_factor", None) or 0.0
        lat = lat / cfg.scaling_factor + shift
        img = self.vae.decode(lat, return_dict=False)[0]
        img = (img.float() / 2 + 0.5).clamp(0, 1)
        return (img * 255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous()

    # ----------------------------------------------------------------- LoRA I/O
    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        from peft.utils import get_peft_model_state_dict

        return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(self.transformer).items()}

    def save_lora(self, directory: str) -> None:
        """Write ``pytorch_lora_weights.safetensors`` loadable by ``Pipeline.load_lora_weights(directory)``."""
        # the adapter metadata carries lora_alpha/target_modules: without it a reload assumes alpha = r
        meta = self.transformer.peft_config["default"].to_dict()
        type(self.pipe).save_lora_weights(directory, transformer_lora_layers=self.lora_state_dict(),
                                          transformer_lora_adapter_metadata=meta)
