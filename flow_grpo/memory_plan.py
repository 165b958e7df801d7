"""The flow side of the memory planner (``flow_grpo plan``): diffusers models of the released configs
(:data:`mmgrpo.utils.memory_plan.MODELS`) cut to any depth, their exact parameter counts (built on the meta device:
no memory), and the ``plan`` subcommand."""
from __future__ import annotations

from mmgrpo.utils.memory_plan import _linear_lora, _meta, plan_main as _plan_main

FLOW_LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out")


def _clip(spec: dict, with_projection: bool, layers: int | None):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    c = dict(spec)
    if layers is not None:
        c["num_hidden_layers"] = layers
    cfg = CLIPTextConfig(vocab_size=49408, max_position_embeddings=77, bos_token_id=49406, eos_token_id=49407,
                         pad_token_id=1, **c)
    return (CLIPTextModelWithProjection if with_projection else CLIPTextModel)(cfg)


def _t5(spec: dict, layers: int | None, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    c = dict(spec)
    if layers is not None:
        c["num_layers"] = layers
    config, model = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    return model(config(relative_attention_num_buckets=32, relative_attention_max_distance=128,
                        is_encoder_decoder=False, use_cache=False, **c))


def _vae(spec: dict):
    from diffusers import AutoencoderKL, AutoencoderKLWan

    if spec["kind"] == "wan":
        return AutoencoderKLWan()  # the release's configuration is the class default

    return AutoencoderKL(in_channels=3, out_channels=3, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                         down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                         sample_size=1024, **spec["vae"])


def flow_transformer(spec: dict, layers: int | None = None):
    from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, WanTransformer3DModel

    c = dict(spec["transformer"])
    if spec["kind"] == "wan":  # one expert (Wan2.2 A14B has two of them)
        if layers is not None:
            c["num_layers"] = layers
        c["patch_size"] = tuple(c["patch_size"])
        return WanTransformer3DModel(**c)
    if spec["kind"] == "flux":
        if layers is not None:
            c.update(num_layers=layers, num_single_layers=layers)
        c["axes_dims_rope"] = tuple(c["axes_dims_rope"])
        return FluxTransformer2DModel(**c)
    if layers is not None:
        c["num_layers"] = layers
        c["dual_attention_layers"] = [i for i in c["dual_attention_layers"] if i < layers]
    c["dual_attention_layers"] = tuple(c["dual_attention_layers"])
    return SD3Transformer2DModel(**c)


def flow_pipeline(spec: dict, layers: int | None = None):
    """A diffusers pipeline with the released widths, every stack (transformer, CLIP, T5) cut to ``layers``; the
    VAE is whole (it is small and frozen). Tokenizers: the full real CLIP BPE (open_clip's file, 49,408 entries)
    and the repo's T5-format Unigram tokenizer (no package ships T5's ``spiece.model``)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, StableDiffusion3Pipeline

    from flow_grpo.models.tiny_tokenizers import build_clip_tokenizer, build_t5_unigram_tokenizer

    sched = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, **spec["scheduler"])
    n_merges = 49408 - 512 - 2
    tr = flow_transformer(spec, layers)
    t5 = _t5(spec["t5"], layers)
    t5_tok = build_t5_unigram_tokenizer(model_max_length=spec["max_sequence_length"])
    if spec["kind"] == "flux":
        return FluxPipeline(scheduler=sched, vae=_vae(spec), text_encoder=_clip(spec["clip_l"], False, layers),
                            tokenizer=build_clip_tokenizer(n_merges), text_encoder_2=t5, tokenizer_2=t5_tok,
                            transformer=tr)
    return StableDiffusion3Pipeline(
        transformer=tr, scheduler=sched, vae=_vae(spec), text_encoder=_clip(spec["clip_l"], True, layers),
        tokenizer=build_clip_tokenizer(n_merges), text_encoder_2=_clip(spec["clip_g"], True, layers),
        tokenizer_2=build_clip_tokenizer(n_merges), text_encoder_3=t5, tokenizer_3=t5_tok)


def counts(spec: dict, layers: int | None = None, lora_r: int = 16, lora_targets=None) -> dict:
    """Exact parameter counts from the config (built on the meta device: no memory): ``all`` (everything loaded:
    transformer, text encoders, VAE), ``full`` (the transformer, what full fine-tuning trains), ``lora`` (adapter
    parameters), ``encoders``, ``vae``, ``layers``, ``per_layer`` (largest block), ``hidden``."""
    wan = spec["kind"] == "wan"
    tr = _meta(lambda: flow_transformer(spec, layers))
    enc = _meta(lambda: _t5(spec["t5"], layers, umt5=wan))
    n_enc = sum(p.numel() for p in enc.parameters())
    for key, proj in (("clip_l", spec["kind"] == "sd3"), ("clip_g", True)):
        if key in spec:
            n_enc += sum(p.numel() for p in _meta(lambda: _clip(spec[key], proj, layers)).parameters())
    vae = sum(p.numel() for p in _meta(lambda: _vae(spec)).parameters())
    k = spec.get("experts", 1)  # Wan2.2 A14B: both experts are loaded and (kind wan22) trained; one runs per step
    n_tr = k * sum(p.numel() for p in tr.parameters())
    blocks = (list(getattr(tr, "transformer_blocks", [])) + list(getattr(tr, "single_transformer_blocks", []))
              + (list(tr.blocks) if wan else []))
    c = spec["transformer"]
    L = len(blocks)
    return {"all": n_tr + n_enc + vae, "full": n_tr,
            "lora": k * _linear_lora(tr, lora_targets or FLOW_LORA_TARGETS, lora_r, skip=()),
            "encoders": n_enc, "vae": vae, "layers": L,
            "per_layer": max(sum(p.numel() for p in b.parameters()) for b in blocks),
            "hidden": c["attention_head_dim"] * c["num_attention_heads"], "vocab": 0, "kv": 0}


def count_wan_activations(spec_name: str = "wan2.1-t2v-14b", lora_r: int = 16) -> dict:
    """The Wan activation constants of :data:`mmgrpo.utils.memory_plan.ACTIVATION_COUNTED`: bytes per video token
    that autograd saves for backward, counted on the meta device (no memory, no compute) at real width in bf16 with
    LoRA on the attention projections. With gradient checkpointing per block at 480x832x81 (32,760 tokens):
    ``a_layer`` = saved(2 blocks) - saved(1 block) per token, ``ckpt_fixed`` = saved(1 block) - a_layer; the one
    block recomputed in backward holds ``block_working_set`` per token: saved(2) - saved(1) *without*
    checkpointing at 3 small token counts, solved for ``c0 + c1 n + c2 n^2`` (c0: frozen weights saved for the input
    gradient, shared; c2 n^2: the math attention's scores, which flash attention does not keep), c1 per token.
    ``a_fixed`` = ckpt_fixed + block_working_set."""
    import torch

    from mmgrpo.utils.memory_plan import get_spec

    spec = get_spec(spec_name)

    def saved(layers: int, ckpt: bool, f: int, h: int, w: int) -> tuple[int, int]:
        from peft import LoraConfig

        with torch.device("meta"):
            m = flow_transformer(spec, layers).to(torch.bfloat16)
            m.add_adapter(LoraConfig(r=lora_r, lora_alpha=lora_r, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
        for n, p in m.named_parameters():
            p.requires_grad_("lora_" in n)
        if ckpt:
            m.enable_gradient_checkpointing()
        m.train()
        total = [0]

        def pack(t):
            total[0] += t.numel() * t.element_size()
            return t

        x = torch.zeros(1, 16, f, h, w, device="meta", dtype=torch.bfloat16)
        text = torch.zeros(1, spec["max_sequence_length"], spec["transformer"]["text_dim"], device="meta",
                           dtype=torch.bfloat16)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            m(hidden_states=x, timestep=torch.zeros(1, device="meta"), encoder_hidden_states=text, return_dict=False)
        return total[0], f * (h // 2) * (w // 2)

    lat = ((spec["frames"] - 1) // 4 + 1, spec["height"] // 8, spec["width"] // 8)
    (s1, n), (s2, _) = saved(1, True, *lat), saved(2, True, *lat)
    a_layer = (s2 - s1) / n
    ckpt_fixed = s1 / n - a_layer
    pts = []
    for f, h, w in ((1, 16, 16), (1, 32, 32), (2, 32, 32)):
        (b1, m), (b2, _) = saved(1, False, f, h, w), saved(2, False, f, h, w)
        pts.append((m, b2 - b1))
    a = torch.tensor([[1.0, m, float(m) ** 2] for m, _ in pts], dtype=torch.float64)
    c = torch.linalg.solve(a, torch.tensor([float(b) for _, b in pts], dtype=torch.float64)).tolist()
    return {"a_layer": round(a_layer, 1), "a_fixed": round(ckpt_fixed + c[1], 1), "ckpt_fixed": round(ckpt_fixed, 1),
            "block_working_set": round(c[1], 1), "attention_n2": round(c[2], 1), "tokens": n}


def _load(rest: list):
    from flow_grpo.config import load_train_config

    kv = [a for a in rest if "=" in a]
    return load_train_config(rest[rest.index("--config") + 1] if "--config" in rest else None, kv)


def plan_main(argv, prog: str = "flow_grpo plan") -> int:
    """``flow_grpo plan``: exit 0 when the run fits, 1 when not, 2 on a bad argument."""
    return _plan_main(argv, "flow", prog, _load, counts)
