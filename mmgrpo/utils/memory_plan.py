"""Memory planner: predicted peak memory per device of a GRPO run (``mmgrpo plan`` / ``flow_grpo plan``).

This module holds the released configs, the arithmetic and the shared command-line pieces; each front-end builds
its models and counts their parameters (:mod:`mmgrpo.vlm.memory_plan`, :mod:`flow_grpo.memory_plan`).

Released configs (:data:`MODELS`) are copied from the public ``config.json`` files (Hugging Face model repos
``Qwen/Qwen2.5-VL-3B-Instruct``, ``Qwen/Qwen2.5-VL-7B-Instruct``, ``Qwen/Qwen2-VL-7B-Instruct``,
``Qwen/Qwen3-VL-4B-Instruct``, ``black-forest-labs/FLUX.1-dev`` (transformer/, text_encoder/, text_encoder_2/, vae/),
``stabilityai/stable-diffusion-3.5-medium`` / ``-large``); ``scripts/rehearse_real_scale.py`` builds them at real width
and truncated depth.

Model (per device, bytes; ``P`` all parameters, ``T`` trainable ones, W processes):

* weights: ``P x 2`` (bf16); FSDP2 / ZeRO-3 shard them (``/W``) plus one unsharded layer in flight (all-gather);
* LoRA adapters: fp32 (peft upcasts them on a bf16 base): ``T x 4`` weights, ``T x 4`` grads, AdamW ``T x 8``;
* full fine-tune in bf16: grads ``T x 2``, AdamW moments ``T x 8`` (fp32), and with ``optim.fp32_master_weights``
  the fp32 masters ``T x 4`` plus their fp32 grads ``T x 4`` during ``step`` (``mmgrpo.utils.master_weights``);
  without masters AdamW runs on the bf16 weights and its moments are bf16 (``T x 4``); sharded engines (FSDP2 /
  ZeRO-3) keep the fp32 state sharded ``/W``; with a KL term (VLM) a frozen bf16 reference copy ``P x 2``;
* activations (gradient checkpointing on): ``tokens x (layers x a_layer + a_fixed)``: each checkpointed layer keeps
  its input, one layer is recomputed at a time, ``a_fixed`` covers embeddings / head / vision tower / working set.
  ``a_layer`` and ``a_fixed`` are **measured** at real width (:data:`ACTIVATION_BYTES`, with the command);
* logits (VLM): ``rows x completion_len x vocab x 10`` (bf16 logits + fp32 log-softmax + its grad); chunked
  log-probs (``algo.logprob_chunk_size``, where available) divide this by ``completion_len / chunk``;
* rollout engine: the HF backend's KV cache ``2 x layers x kv_heads x head_dim x (prompt + completion) x rows x 2``;
  a colocated vLLM engine takes ``rollout.vllm_gpu_memory_utilization x GPU`` instead.

What a CPU measurement cannot show (and this planner does not model): the CUDA caching allocator's fragmentation and
reserved-but-unused blocks (typically 5-20 % on top), NCCL communication buffers (~0.5-2 GB per process group at
default sizes), flash-attention / cuBLAS workspaces and the CUDA context itself (~0.5-1 GB per process).
:data:`GPU_OVERHEAD_BYTES` + :data:`GPU_FRAGMENTATION` add a flat allowance for these on GPU plans.
"""
from __future__ import annotations

import copy
import sys
from typing import Any, Callable

GiB = 1024 ** 3
GPU_OVERHEAD_BYTES = int(1.5 * GiB)  # CUDA context + NCCL buffers + kernels' workspaces (allowance, not measured)
GPU_FRAGMENTATION = 0.10  # caching-allocator slack on GPU (allowance, not measured)

# -------------------------------------------------------------------------------------------- released configs
MODELS: dict[str, dict[str, Any]] = {
    "qwen2.5-vl-3b": dict(
        type="vlm", family="qwen2_5_vl", source="Qwen/Qwen2.5-VL-3B-Instruct config.json",
        text=dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                  num_key_value_heads=2, vocab_size=151936, rope_theta=1e6, mrope_section=[16, 24, 24],
                  tie_word_embeddings=True, max_position_embeddings=128000),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                    fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, hidden_act="silu")),
    "qwen2.5-vl-7b": dict(
        type="vlm", family="qwen2_5_vl", source="Qwen/Qwen2.5-VL-7B-Instruct config.json",
        text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, vocab_size=152064, rope_theta=1e6, mrope_section=[16, 24, 24],
                  tie_word_embeddings=False, max_position_embeddings=128000),
        vision=dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584,
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                    fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, hidden_act="silu")),
    "qwen2-vl-7b": dict(
        type="vlm", family="qwen2_vl", source="Qwen/Qwen2-VL-7B-Instruct config.json",
        text=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                  num_key_value_heads=4, vocab_size=152064, rope_theta=1e6, mrope_section=[16, 24, 24],
                  tie_word_embeddings=False, max_position_embeddings=32768),
        # Qwen2-VL's ViT: embed_dim 1280, mlp_ratio 4 (fc1/fc2, quick_gelu), 16 heads, LayerNorm; no windows
        vision=dict(depth=32, embed_dim=1280, mlp_ratio=4, num_heads=16, hidden_size=3584, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2, hidden_act="quick_gelu")),
    "qwen3-vl-4b": dict(
        type="vlm", family="qwen3_vl", source="Qwen/Qwen3-VL-4B-Instruct config.json",
        text=dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=5e6,
                  mrope_section=[24, 20, 20], mrope_interleaved=True, tie_word_embeddings=True,
                  max_position_embeddings=262144),
        vision=dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2560,
                    patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                    deepstack_visual_indexes=[5, 11, 17], hidden_act="gelu_pytorch_tanh"),
        frame_px=256),  # multiple of 32 (patch 16 x merge 2)
    "flux.1-dev": dict(
        type="flow", kind="flux", source="black-forest-labs/FLUX.1-dev */config.json", max_sequence_length=512,
        transformer=dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                         num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                         guidance_embeds=True, axes_dims_rope=[16, 56, 56]),
        clip_l=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                    projection_dim=768, hidden_act="quick_gelu"),
        t5=dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=32128,
                feed_forward_proj="gated-gelu"),
        vae=dict(latent_channels=16, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
                 use_post_quant_conv=False),
        scheduler=dict(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                       base_image_seq_len=256, max_image_seq_len=4096)),
    "sd3.5-medium": dict(
        type="flow", kind="sd3", source="stabilityai/stable-diffusion-3.5-medium */config.json",
        max_sequence_length=256,
        transformer=dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
                         attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                         caption_projection_dim=1536, pooled_projection_dim=2048, pos_embed_max_size=384,
                         qk_norm="rms_norm", dual_attention_layers=list(range(13))),
        clip_l=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                    projection_dim=768, hidden_act="quick_gelu"),
        clip_g=dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                    projection_dim=1280, hidden_act="gelu"),
        t5=dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=32128,
                feed_forward_proj="gated-gelu"),
        vae=dict(latent_channels=16, scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
                 use_post_quant_conv=False),
        scheduler=dict(shift=3.0)),
}
# Wan-AI/Wan2.1-T2V-14B-Diffusers transformer/config.json; text_encoder: UMT5-XXL (google/umt5-xxl); vae:
# AutoencoderKLWan's defaults (z_dim 16, stride 4 x 8 x 8). Wan2.2-T2V-A14B: two experts of this transformer
# (transformer = high-noise, transformer_2 = low-noise, boundary_ratio 0.875), same text encoder and VAE.
MODELS["wan2.1-t2v-14b"] = dict(
    type="flow", kind="wan", source="Wan-AI/Wan2.1-T2V-14B-Diffusers */config.json", max_sequence_length=512,
    experts=1, frames=81, height=480, width=832,
    transformer=dict(patch_size=[1, 2, 2], num_attention_heads=40, attention_head_dim=128, in_channels=16,
                     out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
                     cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024),
    t5=dict(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=256384,
            feed_forward_proj="gated-gelu"))
MODELS["wan2.2-t2v-a14b"] = copy.deepcopy(MODELS["wan2.1-t2v-14b"])
MODELS["wan2.2-t2v-a14b"].update(source="Wan-AI/Wan2.2-T2V-A14B-Diffusers */config.json", experts=2)
MODELS["sd3.5-large"] = copy.deepcopy(MODELS["sd3.5-medium"])
MODELS["sd3.5-large"].update(source="stabilityai/stable-diffusion-3.5-large */config.json")
MODELS["sd3.5-large"]["transformer"].update(num_layers=38, num_attention_heads=38, caption_projection_dim=2432,
                                            pos_embed_max_size=192, dual_attention_layers=[])



def get_spec(name: str) -> dict:
    """``MODELS[name]``, or ``"<name>/<k>"``: the same model with every width divided by ``k`` (heads too, head
    dims, vocabulary, MRoPE sections, layouts and token ids kept) -- the CI-sized variant of the same code path."""
    if name in MODELS or "/" not in name:
        return MODELS[name]
    base, k = name.split("/")
    k = int(k)
    spec = copy.deepcopy(MODELS[base])
    spec["source"] += f" (widths / {k})"
    if spec["type"] != "vlm":
        raise ValueError(f"{name}: width reduction is implemented for the Qwen-VL models only")
    t, v = spec["text"], spec["vision"]
    hd = t.get("head_dim", t["hidden_size"] // t["num_attention_heads"])
    t["num_attention_heads"] = max(1, t["num_attention_heads"] // k)
    t["num_key_value_heads"] = max(1, t["num_key_value_heads"] // k)
    t["hidden_size"] = t["num_attention_heads"] * hd if "head_dim" not in t else t["hidden_size"] // k
    t["intermediate_size"] //= k
    vh = v.get("hidden_size", 0) if "embed_dim" not in v else v["embed_dim"]
    vhd = vh // v["num_heads"]
    v["num_heads"] = max(1, v["num_heads"] // k)
    if "embed_dim" in v:
        v["embed_dim"] = v["num_heads"] * vhd
        v["hidden_size"] = t["hidden_size"]
    else:
        v["hidden_size"] = v["num_heads"] * vhd
        v["intermediate_size"] //= k
        v["out_hidden_size"] = t["hidden_size"]
    MODELS[name] = spec
    return spec


# Activation bytes per token (a_layer: per checkpointed layer; a_fixed: once per token), measured at real width on
# CPU in bf16 with LoRA + gradient checkpointing (docs/real_scale.md):
#   OMP_NUM_THREADS=2 nice -n 5 python scripts/rehearse_real_scale.py --model M --layers N --json M_N.json  (N=1,2,3)
#   python scripts/rehearse_real_scale.py --fit M_1.json M_2.json M_3.json
# r(N) = (measured step peak - planner without activations) / tokens; a_layer = r(2) - r(1), a_fixed = r(1) -
# a_layer; N = 3 is the out-of-sample check. Tokens: VLM rows x (prompt + completion); flow images x (image + text).
ACTIVATION_BYTES: dict[str, dict[str, float]] = {
    "qwen2.5-vl-7b": {"a_layer": 14746.2, "a_fixed": 463574.0},  # 4 x (371 + 16) tokens; N=3 error -1.4 %
    # per FLUX block (N double + N single blocks = 2N planner layers), 4 x (1024 + 512) tokens
    "flux.1-dev": {"a_layer": 48847.4, "a_fixed": 253009.8},
    # per SD3 joint block, 8 x (1024 + 77 + 256) tokens (CFG: [uncond; cond]); N=3 error +2.2 %
    "sd3.5-medium": {"a_layer": 58701.9, "a_fixed": 166124.9},
}
# Models without a measurement borrow the measured model of their type, scaled by the hidden size (an
# extrapolation: ``activation_for`` says which, and the plan output names it).
# (SD3.5-large scaled from FLUX: +8.8 %; from the measured SD3.5-medium, whose first 13 blocks are dual-attention
# MMDiT-X blocks that large does not have: +43 %.)
_REFERENCE = {"vlm": "qwen2.5-vl-7b", "flow": "flux.1-dev"}
# Wan 14B (per expert; bf16 base, LoRA r=16 on to_q/k/v/out in fp32 as the trainer keeps them, gradient checkpointing
# per block), measured at real width on CPU, 1-2 blocks x 512 / 2,048 video tokens + 512 text tokens, one step
# (forward, loss, backward): step peak = c + tokens x (a_fixed + blocks x a_layer), least squares over the 4
# settings (residuals within 1.9 %; c = 58 MiB, the text side, left out as it does not grow with the clip):
#   OMP_NUM_THREADS=2 nice -n 5 python eval/perf/plan_check.py --json J; python eval/perf/plan_check.py --fit J
# (docs/scaling.md, eval/perf/plan_check_wan14b.jsonl). The depth term rests on 2 depths: the 2-1 block difference
# is 16.8 KB per token at 512 tokens and 30.8 KB at 2,048.
ACTIVATION_BYTES["wan2.1-t2v-14b"] = {"a_layer": 26945.4, "a_fixed": 407152.5}
ACTIVATION_BYTES["wan2.2-t2v-a14b"] = ACTIVATION_BYTES["wan2.1-t2v-14b"]  # one expert runs per forward
# What the meta-device count gave before the measurement (flow_grpo.memory_plan.count_wan_activations: the bytes
# autograd saves, bf16 adapters): a_layer 10.4 KB (the bf16 block input) and a_fixed 603 KB per token; against the
# measurement it over-predicted the step by +8 % at 512 tokens and +26-32 % at 2,048 (a_fixed too large), and its
# a_layer is a third of the measured one. Kept for eval/perf/plan_check.py's comparison; the planner uses the above.
ACTIVATION_COUNTED: dict[str, dict[str, float]] = {
    "wan2.1-t2v-14b": {"a_layer": 10401.9, "a_fixed": 602572.3},
}
ACTIVATION_COUNTED["wan2.2-t2v-a14b"] = ACTIVATION_COUNTED["wan2.1-t2v-14b"]


def activation_for(name: str) -> tuple[dict[str, float], str]:
    """(constants, provenance) for ``name``: measured, counted, or scaled from the reference model of its type."""
    if name in ACTIVATION_BYTES:
        return ACTIVATION_BYTES[name], "measured"
    if name in ACTIVATION_COUNTED:
        return ACTIVATION_COUNTED[name], "counted on the meta device, not measured"
    spec = get_spec(name)
    ref = _REFERENCE[spec["type"]]
    if ref not in ACTIVATION_BYTES:
        return {"a_layer": 0.0, "a_fixed": 0.0}, "none measured"

    def width(s):
        return s["text"]["hidden_size"] if s["type"] == "vlm" else \
            s["transformer"]["attention_head_dim"] * s["transformer"]["num_attention_heads"]

    k = width(spec) / width(MODELS[ref])
    return {a: v * k for a, v in ACTIVATION_BYTES[ref].items()}, f"scaled from {ref} by width ({k:.2f}x)"


# -------------------------------------------------------------------------------------------- parameter counts
# The models are built on the meta device by each front-end's planner (``mmgrpo.vlm.memory_plan.counts``,
# ``flow_grpo.memory_plan.counts``); these helpers are shared.
def _meta(build):
    import torch

    with torch.device("meta"):
        return build()


def _linear_lora(model, targets, r: int, skip=("visual",)) -> int:
    import torch

    n = 0
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets \
                and not any(s in name.split(".") for s in skip):
            n += r * (m.in_features + m.out_features)
    return n


# -------------------------------------------------------------------------------------------- the plan
def plan(spec_name: str, *, full: bool = False, world: int = 1,
         strategy: str = "ddp", rows: int = 8, prompt_tokens: int = 0, completion_len: int = 256,
         flow_tokens: int = 0, fp32_master_weights: bool = True, logprob_chunk: int = 0,
         vllm_fraction: float = 0.0, gpu_gb: float = 0.0, gpu: bool = True, activation: dict | None = None,
         n: dict, reference: bool = False, sequence_parallel: int = 1) -> dict:
    """Per-device bytes, by component, and ``total``; ``fits`` when ``gpu_gb`` is given.

    ``n``: the parameter counts of the model (``counts`` of its front-end's planner, at ``layers`` and ``lora_r``).
    ``rows``: sequences per micro-batch (VLM: rollouts per forward/backward; flow: images per chunk);
    ``prompt_tokens`` (VLM, per row) / ``flow_tokens`` (flow: image + text tokens per image); ``reference``: a full
    fine-tune keeps a frozen bf16 copy of the model as the KL reference (VLM ``algo.kl_coef > 0``: ``load_policy``'s
    ``need_reference``; LoRA uses the model with the adapter off, no copy). ``sequence_parallel`` (flow): each process
    of a group holds 1/P of the tokens' activations (``run.sequence_parallel``)."""
    spec = get_spec(spec_name)
    sharded = strategy in ("fsdp2", "zero3")
    div = world if sharded else 1
    T = n["full"] if full else n["lora"]
    out: dict[str, float] = {}
    # flow: only the transformer goes through accelerator.prepare; text encoders and VAE stay replicated
    shard = n["all"] if spec["type"] == "vlm" else n["full"]
    out["weights"] = (shard / div + n["all"] - shard) * 2 + (n["per_layer"] * 2 if sharded and world > 1 else 0)
    if full:
        fp32_state = fp32_master_weights or sharded  # else AdamW runs on the bf16 weights: bf16 moments
        out["grads"] = T * 2 / div
        out["optimizer"] = T * (8 if fp32_state else 4) / div
        out["master_weights"] = (T * 4 + T * 4) / div if fp32_state else 0.0
        # AdamW's step temporaries: torch's foreach AdamW (the default on GPU) builds sqrt(v) for every trained
        # tensor at once, one copy of them in the moments' dtype. Measured need at real width (Qwen2.5-VL-3B, 1
        # layer, full FT on CPU, where torch uses the single-tensor AdamW): 10.11 GiB against 7.83 without this
        # term (docs/real_scale.md)
        out["optimizer_step"] = T * (4 if fp32_state else 2) / div
        if reference:
            out["reference"] = n["all"] * 2  # replicated frozen bf16 copy (not prepared by accelerate)
    else:
        out["lora_weights"] = T * 4  # adapters are small: replicated under every strategy
        out["grads"] = T * 4
        out["optimizer"] = T * 8
    a = activation or activation_for(spec_name)[0]
    if spec["type"] == "vlm":
        tokens = rows * (prompt_tokens + completion_len)
        chunk = min(logprob_chunk, completion_len) if logprob_chunk else completion_len
        out["logits"] = rows * chunk * n["vocab"] * 10
        out["activations"] = tokens * (n["layers"] * a["a_layer"] + a["a_fixed"])
        if vllm_fraction and gpu_gb:
            out["rollout_engine"] = vllm_fraction * gpu_gb * GiB
        else:
            out["rollout_engine"] = n["layers"] * n["kv"] * rows * (prompt_tokens + completion_len)
    else:
        tokens = rows * flow_tokens / max(1, sequence_parallel)
        out["activations"] = tokens * (n["layers"] * a["a_layer"] + a["a_fixed"])
    total = sum(out.values())
    if gpu:
        out["gpu_overhead"] = GPU_OVERHEAD_BYTES + GPU_FRAGMENTATION * total
        total = sum(out.values())
    out["total"] = total
    if gpu_gb:
        out["fits"] = bool(total <= gpu_gb * GiB)
    return out


def rehearsal_rows(spec: dict) -> int:
    """Rows of one ``rehearse_real_scale.py`` forward: 4 rollouts; the SD3 rehearsal runs CFG, one forward on
    [uncond; cond], so 8 rows there."""
    return 8 if spec["type"] == "flow" and spec["kind"] == "sd3" else 4


def rehearsal_tokens(spec: dict, tokens: dict) -> int:
    """Activation tokens of one rehearsal step, the quantity the activation constants are per: rows x tokens per
    row (the fit in ``rehearse_real_scale.py --fit`` must divide by the same number ``plan`` multiplies by)."""
    per_row = (tokens["prompt_tokens"] + tokens["completion_len"]) if spec["type"] == "vlm" else flow_tokens(spec)
    return rehearsal_rows(spec) * per_row


def plan_rehearsal(spec: dict, n: dict, full: bool, tokens: dict, activation: dict | None = None) -> dict:
    """The CPU prediction for one ``rehearse_real_scale.py`` step (no GPU allowances); ``n``: the counts of the
    model cut to the rehearsal's depth."""
    name = next(k for k, v in MODELS.items() if v is spec)
    rows = rehearsal_rows(spec)
    if spec["type"] == "vlm":
        return plan(name, full=full, rows=rows, prompt_tokens=tokens["prompt_tokens"],
                    completion_len=tokens["completion_len"], gpu=False, activation=activation, n=n)
    return plan(name, full=full, rows=rows, flow_tokens=flow_tokens(spec), gpu=False, activation=activation, n=n)


def flow_tokens(spec: dict, height: int = 512, width: int = 512, frames: int = 0) -> int:
    """Image + text tokens per image in the transformer (FLUX: 2x2-packed latents + 512 T5 tokens; SD3: patch-2
    latents + 77 CLIP + 256 T5 tokens); Wan: the video tokens, ``(frames - 1) / 4 + 1`` latent frames of
    ``height / 16 x width / 16`` patches (the text enters by cross-attention; ``frames`` 0 = the release's 81)."""
    if spec["kind"] in ("wan", "wan22"):
        f = frames or spec["frames"]
        return ((f - 1) // 4 + 1) * (height // 16) * (width // 16)
    img = (height // 16) * (width // 16)
    return img + (spec["max_sequence_length"] + (77 if spec["kind"] == "sd3" else 0))


def plan_full_depth(spec: dict, n: dict, world: int = 8, rows: int = 8, prompt_tokens: int = 1024,
                    completion_len: int = 256) -> dict:
    """Per-GPU GiB at the released depth on ``world`` GPUs, DDP / FSDP2 / ZeRO-3 x LoRA / full; ``n``: the counts
    at the released depth."""
    name = next(k for k, v in MODELS.items() if v is spec)
    ft = flow_tokens(spec) if spec["type"] == "flow" else 0
    res = {"world": world, "params": n["all"], "trainable_full": n["full"], "trainable_lora_r16": n["lora"],
           "setting": (f"rows={rows}, prompt={prompt_tokens}, completion={completion_len}" if spec["type"] == "vlm"
                       else f"rows={rows} images 512x512, {ft} tokens each")}
    for strat in ("ddp", "fsdp2", "zero3"):
        for mode in ("lora", "full"):
            p = plan(name, full=mode == "full", world=world, strategy=strat, rows=rows, prompt_tokens=prompt_tokens,
                     completion_len=completion_len, flow_tokens=ft, n=n)
            res[f"{strat}_{mode}_gib"] = round(p["total"] / GiB, 2)
    return res


def format_plan(p: dict) -> str:
    lines = [f"  {k:<16} {v / GiB:8.2f} GiB" for k, v in p.items() if k not in ("total", "fits")]
    lines.append(f"  {'total':<16} {p['total'] / GiB:8.2f} GiB")
    if "fits" in p:
        lines.append(f"  fits: {'yes' if p['fits'] else 'NO'}")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- command line
PLAN_HELP = """Predicted peak memory per device for the run this config describes (nothing is loaded: parameter counts
come from the checkpoint's config.json on the meta device, or from --model for a released model).

plan options (before the usual --config / key=value):
  --gpu-gb G        GPU memory in GiB to check against (default 80)
  --world W         processes / GPUs (default 1)
  --strategy S      ddp | fsdp2 | zero3 (default ddp; fsdp2 / zero3 shard weights, grads, optimizer state)
  --model NAME      a released model instead of model.path / model.pipeline_dir: """ + ", ".join(sorted(MODELS)) + """
  --prompt-tokens N VLM: prompt tokens per rollout, vision included (default: data.max_prompt_tokens or 1024)
  --profile NAME    the overrides of a profile (cpu: the CPU rehearsal's run; mmgrpo/utils/profiles.py)

A depth-truncated folder (scripts/rehearse_real_scale.py --build-only) is planned at its own depth; a width-reduced
or tiny model has no measured figures and is refused (exit 2) with that reason.

Activation figures are measured at real width on CPU (docs/real_scale.md); a GPU adds CUDA-allocator
fragmentation, NCCL buffers, flash-attention workspaces and the CUDA context, covered only by a flat allowance."""


def _match_model(kind: str, cfg_dict: dict) -> tuple[str, int | None] | None:
    """(name, layers) of the MODELS entry whose widths equal a checkpoint's config (hidden size, vocabulary, heads):
    ``layers`` is the folder's depth when it is cut shorter than the released model (a depth-truncated folder of
    ``scripts/rehearse_real_scale.py``), else None. None when no released model has these widths."""
    for name, spec in MODELS.items():
        if spec["type"] == "vlm" and kind == "vlm":
            t = cfg_dict.get("text_config", cfg_dict)
            if all(t.get(k) == spec["text"][k] for k in ("hidden_size", "vocab_size", "num_attention_heads")):
                n = t.get("num_hidden_layers")
                return name, (n if n and n != spec["text"]["num_hidden_layers"] else None)
        if spec["type"] == "flow" and kind == "flow":
            c = spec["transformer"]
            cls = cfg_dict.get("_class_name", "")
            if all(cfg_dict.get(k) == c[k] for k in ("num_attention_heads", "attention_head_dim")) \
                    and cls.startswith("Flux") == (spec["kind"] == "flux") \
                    and cls.startswith("Wan") == (spec["kind"] == "wan"):
                n = cfg_dict.get("num_layers")
                return name, (n if n and n != c["num_layers"] else None)
    return None


UNKNOWN_WIDTHS = ("widths match none of the released models the planner knows ({models}). A tiny or width-reduced "
                  "model (the smoke models, a /k CI variant) has no measured activation figures, so no plan is made "
                  "for it; use --model NAME to plan the released model it stands for")


def checkpoint_config_path(kind: str, cfg: Any) -> str:
    import os

    return (os.path.join(cfg.model.path, "config.json") if kind == "vlm"
            else os.path.join(cfg.model.pipeline_dir, "transformer", "config.json"))


def plan_for_config(kind: str, cfg: Any, counts: Callable[..., dict], *, world: int = 1, strategy: str = "ddp",
                    gpu: bool = True, gpu_gb: float = 0.0, model: str | None = None, prompt_tokens: int = 0
                    ) -> tuple[str, int | None, dict] | None:
    """(released model name, truncated depth or None, :func:`plan`) for a train config; the model's widths come
    from its checkpoint folder's config.json (or ``model``). None when the widths are no released model's.
    ``counts(spec, layers, lora_r)``: the front-end's exact parameter counts (``mmgrpo.vlm.memory_plan.counts``,
    ``flow_grpo.memory_plan.counts``). Raises OSError when the config.json cannot be read."""
    import json
    import os

    layers = None
    if model is None:
        with open(checkpoint_config_path(kind, cfg)) as f:
            m = _match_model(kind, json.load(f))
        if m is None:
            return None
        model, layers = m
    if model == "wan2.1-t2v-14b" and os.path.isfile(os.path.join(cfg.model.pipeline_dir, "transformer_2",
                                                                  "config.json")):
        model = "wan2.2-t2v-a14b"  # the same transformer widths, two experts
    spec = MODELS[model]
    if spec["type"] != kind:
        raise ValueError(f"{model} is not a {'Qwen-VL' if kind == 'vlm' else 'flow'} model")
    lora = cfg.model.lora
    n = counts(spec, layers, lora.rank)
    if kind == "vlm":
        frac = cfg.rollout.vllm_gpu_memory_utilization if (cfg.rollout.backend == "vllm"
                                                             and cfg.rollout.vllm_mode == "colocate") else 0.0
        p = plan(model, full=not lora.enabled, world=world, strategy=strategy, rows=cfg.run.micro_batch_size,
                 prompt_tokens=prompt_tokens or cfg.data.max_prompt_tokens or 1024,
                 completion_len=cfg.rollout.max_new_tokens, fp32_master_weights=cfg.optim.fp32_master_weights,
                 logprob_chunk=int(getattr(cfg.algo, "logprob_chunk_size", 0) or 0), vllm_fraction=frac,
                 gpu_gb=gpu_gb, gpu=gpu, n=n, reference=cfg.algo.kl_coef > 0)
    else:
        s = dict(spec, max_sequence_length=cfg.model.max_sequence_length or spec["max_sequence_length"])
        p = plan(model, full=not lora.enabled, world=world, strategy=strategy,
                 rows=cfg.sample.batch_size * (2 if cfg.sample.cfg else 1),
                 flow_tokens=flow_tokens(s, cfg.sample.height, cfg.sample.width, cfg.sample.num_frames),
                 fp32_master_weights=cfg.optim.fp32_master_weights, gpu_gb=gpu_gb, gpu=gpu, n=n,
                 sequence_parallel=cfg.run.sequence_parallel)
    return model, layers, p


def plan_main(argv, kind: str, prog: str, load_config: Callable[[list], Any], counts: Callable[..., dict]) -> int:
    """``mmgrpo plan`` / ``flow_grpo plan`` (``load_config(args)``: the front-end's config from the command line);
    exit 0 when the run fits, 1 when not, 2 on a bad argument."""
    args = plan_args(argv, kind)
    if args is None:
        return 0
    known, rest = args
    from mmgrpo.utils.profiles import expand_profile

    cfg = load_config(expand_profile(rest, kind, prog))  # --profile cpu: plan the CPU rehearsal's run
    path = checkpoint_config_path(kind, cfg)
    try:
        res = plan_for_config(kind, cfg, counts, world=known.world, strategy=known.strategy, gpu_gb=known.gpu_gb,
                              model=known.model, prompt_tokens=known.prompt_tokens)
    except OSError:
        print(f"{prog}: {path} not found: give a checkpoint folder or --model NAME", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"{prog}: --model {e}", file=sys.stderr)
        return 2
    if res is None:
        print(f"{prog}: {path}: " + UNKNOWN_WIDTHS.format(models=", ".join(sorted(MODELS))), file=sys.stderr)
        return 2
    name, layers, p = res
    depth = f", truncated to {layers} layers (the folder's depth)" if layers else ""
    print(f"{prog}: {name} ({MODELS[name]['source']}){depth}, {known.strategy} x {known.world}, "
          f"{'full fine-tune' if p.get('master_weights') is not None else 'LoRA'}, activations "
          f"{activation_for(name)[1]}; per device:")
    print(format_plan(p))
    return 0 if p["fits"] else 1


def plan_args(argv, kind: str) -> tuple | None:
    """``(known plan options, the remaining config arguments)`` of ``mmgrpo plan`` / ``flow_grpo plan``; None after
    printing ``--help``."""
    import argparse

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--gpu-gb", type=float, default=80.0)
    pre.add_argument("--world", type=int, default=1)
    pre.add_argument("--strategy", choices=["ddp", "fsdp2", "zero3"], default="ddp")
    pre.add_argument("--model", choices=sorted(MODELS), default=None)
    pre.add_argument("--prompt-tokens", type=int, default=0)
    if any(a in ("-h", "--help") for a in argv):
        print(PLAN_HELP)
        if kind == "flow":  # flow_grpo train --help lists the config options
            print("\nconfig options: as for flow_grpo train (flow_grpo train --help)")
            return None
    return pre.parse_known_args(argv)
