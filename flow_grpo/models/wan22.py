"""Wan2.2 text-to-video adapter (``WanPipeline`` folders of Wan2.2): the A14B two-expert model and TI2V-5B.

* **A14B** (``transformer`` + ``transformer_2`` + ``boundary_ratio`` in ``model_index.json``): two transformers of the
  same architecture. ``WanPipeline.__call__`` runs ``transformer`` (the high-noise expert) at the steps whose
  scheduler timestep is ``>= boundary_ratio * num_train_timesteps`` (0.875 x 1000 in the T2V release) and
  ``transformer_2`` (the low-noise expert) below, with ``guidance_scale`` resp. ``guidance_scale_2`` (default: the
  same). The adapter routes every row of a forward the same way, from the timestep it feeds, so a step's velocity,
  its SDE mean and hence its log-prob come from the expert that made it, at sampling and again at training.
  Which expert is trained is the kind: ``wan22`` trains both (one module holding the two, :class:`ExpertPair`,
  is what the trainer prepares), ``wan22_high`` / ``wan22_low`` only one (the other stays frozen, outside the
  prepared module; a gradient-carrying forward on one of its steps is refused: restrict the trained steps, e.g.
  ``sample.window_range``, to the trained expert's steps, :meth:`Wan22Adapter.expert_steps` says which).
* **TI2V-5B** (``expand_timesteps=True``, one transformer, the 16x Wan2.2 VAE with 48 latent channels): the
  timestep is fed per token, ``(B, F' h/2 w/2)``, all equal to the step's timestep in text-to-video (the
  pipeline's ``mask[0][0][:, ::2, ::2] * t``); everything else is the Wan2.1 adapter's.

Sigmas, timesteps (integer for UniPC folders), CFG (two passes, ``v_u + w (v_c - v_u)``), the UMT5 text and the
decode are :class:`~flow_grpo.models.wan.WanAdapter`'s.

* **A14B I2V** (``WanImageToVideoPipeline`` with ``transformer_2``, ``boundary_ratio`` 0.9 in the release, no CLIP
  image encoder): :class:`Wan22I2VAdapter`, the expert routing above on Wan2.1 I2V's first-frame condition (the
  mask and the VAE latents of the image followed by black frames, concatenated to the noisy latents in channels;
  :class:`~flow_grpo.models.wan_i2v.WanI2VAdapter`), without CLIP image tokens. Both experts are trained.

Not covered: TI2V-5B with an image (``WanImageToVideoPipeline(expand_timesteps=True)`` overwrites the first latent
frame with the image's at every step, so the SDE's log-prob would have to leave those dimensions out).

Several processes with both experts trained (``wan22``, ``wan22_i2v``): a step batch uses one expert, so under DDP
the other expert's trainable parameters get no gradient in that backward; DDP then needs
``run.ddp_find_unused_parameters=true`` (refused without it: DDP would leave the replicas apart). DDP with it and FSDP2
(forced on CPU) train as one process does (2 gloo processes, tests/flow_grpo/test_sequence_parallel.py).

LoRA files (:meth:`Wan22Adapter.save_lora`): the high-noise expert's in ``pytorch_lora_weights.safetensors``, the
low-noise expert's in ``pytorch_lora_weights_transformer_2.safetensors``; load them with
``pipe.load_lora_weights(d)`` and ``pipe.load_lora_weights(d, weight_name=..., load_into_transformer_2=True)``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from .base import FlowModelAdapter, PromptEmbeds
from .wan import WanAdapter
from .wan_i2v import WanI2VAdapter
from .tiny import build_tiny_wan22_pipeline, build_tiny_wan22_ti2v_pipeline, build_tiny_wan22_i2v_pipeline

LOW_NOISE_LORA_FILE = "pytorch_lora_weights_transformer_2.safetensors"


def is_wan22(config) -> bool:
    """A ``WanPipeline`` config (``model_index.json`` or ``pipe.config``) of Wan2.2: a second transformer, a
    boundary, or per-token timesteps."""
    t2 = config.get("transformer_2")
    has_t2 = t2 is not None and list(t2) != [None, None]
    return has_t2 or config.get("boundary_ratio") is not None or bool(config.get("expand_timesteps", False))


class ExpertPair(torch.nn.Module):
    """The two A14B experts as one module (what the trainer prepares and the optimizer sees when both are trained):
    ``forward(..., expert="high" | "low")`` runs one of them. ``high`` is the pipeline's ``transformer``, ``low`` its
    ``transformer_2`` (the same objects: sampling through the pipeline sees the trained weights).

    A forward runs one expert, so the other's trainable weights get no gradient from it: under DDP the trainer
    needs ``run.ddp_find_unused_parameters=true`` (``partial_forward``; without it DDP silently leaves the replicas
    apart). A full export writes one diffusers model folder per expert (:meth:`export_parts`)."""

    partial_forward = True  # a forward uses part of the trainable weights (flow_grpo.build.setup_model checks DDP)

    def __init__(self, high: torch.nn.Module, low: torch.nn.Module):
        super().__init__()
        self.high, self.low = high, low

    def forward(self, *args, expert: str, **kwargs):
        return getattr(self, expert)(*args, **kwargs)

    @property
    def config(self):
        return self.high.config

    def export_parts(self, state: dict) -> dict:
        """``{subfolder: (expert, its state)}`` of a state dict of this module (keys ``high.*`` / ``low.*``): the
        high-noise expert in the export folder itself, the low-noise one in ``transformer_2/``."""
        return {sub: (getattr(self, e), {k[len(e) + 1:]: v for k, v in state.items() if k.startswith(e + ".")})
                for sub, e in (("", "high"), ("transformer_2", "low"))}

    @property
    def dtype(self) -> torch.dtype:
        return self.high.dtype


class Wan22Adapter(WanAdapter):
    """Wan2.2 T2V: A14B (two experts; ``train_experts`` both | high | low) or TI2V-5B (one transformer, per-token
    timesteps). ``guidance_scale_2``: the low-noise expert's CFG scale (None = the one the sampler passes, as the
    pipeline's default)."""

    kind = "wan22"
    pipeline_cls_name = "WanPipeline"
    tiny = {"wan22": build_tiny_wan22_pipeline, "wan22_ti2v": build_tiny_wan22_ti2v_pipeline}
    evidence = ("tests/flow_grpo/test_models_wan22.py::test_wan22_a14b_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_generator_trains_lora_two_epochs",
                "flow",
                "A14B T2V (both experts trained; DDP needs run.ddp_find_unused_parameters=true) and TI2V-5B T2V")
    wan22 = True
    train_experts = "both"

    def __init__(self, pipe, device="cpu", dtype=torch.float32, max_sequence_length: int | None = None,
                 num_frames: int | None = None, negative_prompt: str = "", guidance_scale_2: Optional[float] = None):
        t2, ratio = getattr(pipe, "transformer_2", None), pipe.config.get("boundary_ratio")
        if (t2 is None) != (ratio is None):
            raise ValueError("Wan2.2: transformer_2 and boundary_ratio come together (the A14B folders have both); "
                             f"got transformer_2={'set' if t2 is not None else None}, boundary_ratio={ratio}")
        if t2 is None and not pipe.config.get("expand_timesteps", False):
            raise ValueError("Wan2.2 adapter on a Wan2.1 folder (one transformer, no expand_timesteps): use "
                             "model.kind=wan")
        if t2 is None and self.train_experts != "both":
            raise ValueError(f"model.kind={self.kind}: this Wan2.2 folder has one transformer (TI2V-5B); use wan22")
        super().__init__(pipe, device=device, dtype=dtype, max_sequence_length=max_sequence_length,
                         num_frames=num_frames, negative_prompt=negative_prompt)
        self.guidance_scale_2 = guidance_scale_2
        self.expand_timesteps = bool(pipe.config.get("expand_timesteps", False))
        self.experts: dict[str, torch.nn.Module] = {"high": pipe.transformer}
        self.boundary = None
        if t2 is not None:
            t2.to(self.device)
            if t2.dtype != dtype:
                t2.to(dtype=dtype)
            t2.requires_grad_(False)
            self.experts["low"] = t2
            self.boundary = float(ratio) * float(pipe.scheduler.config.num_train_timesteps)
        self.trained = list(self.experts) if self.train_experts == "both" else [self.train_experts]
        # the module the trainer prepares (and ``reference_settings`` fingerprints): both experts, or the trained one
        self.transformer = (ExpertPair(self.experts["high"], self.experts["low"]) if len(self.trained) == 2
                            else self.experts[self.trained[0]])
        self.model = self.transformer

    # ----------------------------------------------------------------- experts
    def expert_of(self, t: torch.Tensor) -> list[str]:
        """The expert of each (B,) timestep, as ``WanPipeline.__call__`` picks it: high if ``t >= boundary``."""
        if self.boundary is None:
            return ["high"] * len(t)
        return ["high" if float(v) >= self.boundary else "low" for v in t.tolist()]

    def expert_steps(self, num_steps: int, height: int, width: int) -> dict[str, list[int]]:
        """{expert: the step indices k it makes} on the grid ``sigmas(num_steps, ...)``."""
        sig = self.sigmas(num_steps, height, width)
        out: dict[str, list[int]] = {e: [] for e in self.experts}
        for k in range(num_steps):
            out[self.expert_of(self.timestep(float(sig[k]), 1))[0]].append(k)
        return out

    def _call(self, expert: str, **kw) -> torch.Tensor:
        if expert in self.trained:
            if isinstance(self.transformer, ExpertPair):
                return self.model(expert=expert, return_dict=False, **kw)[0]
            return self.model(return_dict=False, **kw)[0]
        if torch.is_grad_enabled():
            raise ValueError(f"model.kind={self.kind} trains the {self.trained[0]}-noise expert, but a trained step "
                             f"is made by the frozen {expert}-noise one (its log-prob has no gradient): restrict "
                             f"the trained steps (e.g. sample.window_range) to {self.trained[0]}-noise steps "
                             "(adapter.expert_steps(K, H, W) lists them)")
        return self.experts[expert](return_dict=False, **kw)[0]

    # ----------------------------------------------------------------- model
    def _timestep_input(self, t: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """What the transformer is fed: (B,) or, with ``expand_timesteps``, (B, F' h/2 w/2) in fp32."""
        if not self.expand_timesteps:
            return t
        _, ph, pw = self.transformer.config.patch_size
        f, h, w = latents.shape[2:]
        mask = torch.ones(f, h, w, dtype=torch.float32, device=latents.device)[:, ::ph, ::pw]
        return torch.stack([(mask * v).flatten() for v in t])

    def _velocity(self, expert: str, x, t, embeds: PromptEmbeds, gs: float, cfg: bool) -> torch.Tensor:
        ts = self._timestep_input(t, x)
        v = self._call(expert, hidden_states=x, timestep=ts, encoder_hidden_states=embeds.prompt_embeds)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            if expert == "low" and self.guidance_scale_2 is not None:
                gs = self.guidance_scale_2
            v_u = self._call(expert, hidden_states=x, timestep=ts, encoder_hidden_states=embeds.neg_prompt_embeds)
            v = v_u + gs * (v - v_u)
        return v

    def predict_velocity(self, latents, sigma, embeds: PromptEmbeds, guidance_scale: float = 5.0,
                         cfg: bool = False) -> torch.Tensor:
        """Rows are grouped by expert (one call per expert present; a batch at one sigma is one call)."""
        b = latents.shape[0]
        if len(embeds) != b:
            raise ValueError(f"embeds batch {len(embeds)} != latents batch {b}")
        if latents.ndim != 5:
            raise ValueError(f"Wan latents must be (B, C, F, h, w), got shape {tuple(latents.shape)}")
        t, x = self.timestep(sigma, b), latents.to(self.dtype)
        experts = self.expert_of(t)
        if len(set(experts)) == 1:
            return self._velocity(experts[0], x, t, embeds, guidance_scale, cfg).float()
        out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        for e in dict.fromkeys(experts):
            idx = torch.tensor([i for i, ei in enumerate(experts) if ei == e], device=x.device)
            out[idx] = self._velocity(e, x[idx], t[idx], embeds.index(idx), guidance_scale, cfg).float()
        return out

    # ----------------------------------------------------------------- training setup
    def add_lora(self, *args, **kwargs) -> list[torch.nn.Parameter]:
        params, pair = [], self.transformer
        try:
            for e in self.trained:  # the same LoRA settings on each trained expert (seeded init: in order)
                self.transformer = self.experts[e]
                params += FlowModelAdapter.add_lora(self, *args, **kwargs)
        finally:
            self.transformer = pair
        return params

    def enable_full_finetune(self) -> list[torch.nn.Parameter]:
        for e in self.trained:
            self.experts[e].requires_grad_(True)
        return self.trainable_parameters()

    def set_gradient_checkpointing(self, enabled: bool) -> None:
        pair = self.transformer
        try:
            for e in self.trained:
                self.transformer = self.experts[e]
                FlowModelAdapter.set_gradient_checkpointing(self, enabled)
        finally:
            self.transformer = pair

    @contextlib.contextmanager
    def reference(self) -> Iterator[None]:
        """The base model: the LoRA of every trained expert disabled."""
        if not self.lora_enabled:
            raise RuntimeError("reference(): no LoRA adapter; full fine-tuning needs an explicit reference model")
        for e in self.trained:
            self.experts[e].disable_adapters()
        try:
            yield
        finally:
            for e in self.trained:
                self.experts[e].enable_adapters()

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """The trained experts' LoRA tensors, keys prefixed ``high.`` / ``low.``."""
        from peft.utils import get_peft_model_state_dict

        return {f"{e}.{k}": v.detach().cpu().clone() for e in self.trained
                for k, v in get_peft_model_state_dict(self.experts[e]).items()}

    def save_lora(self, directory: str) -> None:
        """Each trained expert's LoRA in its own file (module docstring), loadable by ``WanPipeline``."""
        from peft.utils import get_peft_model_state_dict

        for e in self.trained:
            m = self.experts[e]
            type(self.pipe).save_lora_weights(
                directory, transformer_lora_layers=get_peft_model_state_dict(m),
                transformer_lora_adapter_metadata=m.peft_config["default"].to_dict(),
                weight_name=None if e == "high" else LOW_NOISE_LORA_FILE)


class Wan22HighAdapter(Wan22Adapter):
    """Wan2.2 A14B, only the high-noise expert trained (``model.kind=wan22_high``)."""

    kind = "wan22_high"
    evidence = ("tests/flow_grpo/test_models_wan22.py::test_wan22_one_expert_trained",
                "tests/flow_grpo/test_trainer_generators.py::test_wan22_trains_only_one_expert",
                "flow, window", "A14B, high-noise expert only: train its steps")
    train_experts = "high"


class Wan22LowAdapter(Wan22Adapter):
    """Wan2.2 A14B, only the low-noise expert trained (``model.kind=wan22_low``)."""

    kind = "wan22_low"
    evidence = ("tests/flow_grpo/test_models_wan22.py::test_wan22_one_expert_trained",
                "tests/flow_grpo/test_trainer_generators.py::test_wan22_trains_only_one_expert",
                "flow, window", "A14B, low-noise expert only: train its steps")
    train_experts = "low"


class Wan22I2VAdapter(Wan22Adapter, WanI2VAdapter):
    """Wan2.2 A14B image-to-video (``model.kind=wan22_i2v``): both experts trained; reference images as for Wan2.1
    I2V (a JSONL ``image`` field per prompt). TI2V-5B with an image is refused (module docstring)."""

    kind = "wan22_i2v"
    pipeline_cls_name = "WanImageToVideoPipeline"
    tiny = {"wan22_i2v": build_tiny_wan22_i2v_pipeline}
    evidence = ("tests/flow_grpo/test_models_wan22.py::test_wan22_i2v_matches_pipeline_call_bitwise",
                "tests/flow_grpo/test_trainer_generators.py::test_wan22_i2v_trains_from_a_jsonl_prompt_file_with_reference_images",
                "flow", "A14B I2V, both experts; TI2V-5B I2V refused")
    reference_label = "Wan2.2 I2V"

    def __init__(self, pipe, *args, **kwargs):
        if pipe.config.get("expand_timesteps", False):
            raise ValueError("Wan2.2 TI2V-5B image-to-video (expand_timesteps) is not supported: its first latent "
                             "frame is replaced by the image's at every step; use the text-to-video folder "
                             "(WanPipeline, model.kind=wan22)")
        super().__init__(pipe, *args, **kwargs)

    def _velocity(self, expert: str, x, t, embeds: PromptEmbeds, gs: float, cfg: bool) -> torch.Tensor:
        cond = embeds.cond_latents
        if cond is None:
            raise ValueError("Wan2.2 I2V: the embeddings carry no reference image (see encode_prompts)")
        if cond.shape[2:] != x.shape[2:]:
            raise ValueError(f"Wan2.2 I2V: the condition was encoded for latent (F', h, w) = {tuple(cond.shape[2:])}"
                             f", the latents are {tuple(x.shape[2:])}: call set_resolution / set_num_frames before "
                             "encode_prompts")
        # as the pipeline: concatenate in fp32, then cast the whole input to the transformer dtype
        xc = torch.cat([x.float(), cond.to(x.device, torch.float32)], dim=1).to(self.dtype)
        kw = {"encoder_hidden_states_image": embeds.image_embeds}
        v = self._call(expert, hidden_states=xc, timestep=t, encoder_hidden_states=embeds.prompt_embeds, **kw)
        if cfg:
            if embeds.neg_prompt_embeds is None:
                raise ValueError("cfg=True needs negative embeddings")
            if expert == "low" and self.guidance_scale_2 is not None:
                gs = self.guidance_scale_2
            v_u = self._call(expert, hidden_states=xc, timestep=t, encoder_hidden_states=embeds.neg_prompt_embeds,
                             **kw)
            v = v_u + gs * (v - v_u)
        return v
