"""Sequence (context) parallelism for the video transformers: Ulysses all-to-all over attention heads, through
diffusers' own context-parallel hooks (``ModelMixin.enable_parallelism`` with a ``ContextParallelConfig``: each
rank of the sequence-parallel group holds 1/P of the video tokens between the model's ``_cp_plan`` split and
gather points; self-attention exchanges them for 1/P of the heads with an all-to-all, and back).

What holds (tests/flow_grpo/test_sequence_parallel.py, 2 gloo processes on CPU): with the same inputs on every rank
of the group, the transformer output, hence the adapter's velocity and an SDE step's log-prob, equals the
one-process value; each rank's parameter gradient is the contribution of its token shard, so the gradients **summed
over the group** (:func:`sum_gradients`) equal the one-process gradient within float tolerance.

What a training loop has to do with it (the flow trainer's ``run.sequence_parallel``, :mod:`flow_grpo.seq_parallel`):
give every rank of a sequence-parallel group the same samples (same prompts, seeds and noise), sum the gradients over
the group before the data-parallel average (or scale the loss by the number of processes under DDP/FSDP averaging
over all ranks), and count samples per group rather than per rank. Supported kinds: those whose diffusers transformer
declares a ``_cp_plan`` (tested: Wan2.1 T2V and Wan2.2 A14B with both experts; the FLUX/FLUX.2/Qwen-Image image
models have plans too, untested here), and HunyuanVideo 1.5 with our own plan (:data:`OWN_PLANS`: diffusers 0.42
has none; within 1e-5 of one process, not bitwise: its attention mask is the key mask only). LTX-2's diffusers plan
fails (refused; docs/generators.md, "Sequence parallelism: HunyuanVideo 1.5 and LTX-2"). Token and head counts
must be divisible by the degree.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch


def _hunyuan_video15_plan():
    """Our context-parallel plan for HunyuanVideo 1.5 (diffusers 0.42 declares none): the video tokens and their
    RoPE tables are split at the first block and gathered after ``proj_out``; the text tokens (MLLM + ByT5 + image,
    reordered by the model) stay whole on every process. Attention is joint, so :class:`HunyuanVideo15SPProcessor`
    passes a key mask in which the text keys are valid on the group's first process only: after Ulysses' all-to-all
    each text key appears once."""
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    rope = ContextParallelInput(split_dim=0, expected_dims=2, split_output=True)
    return {"rope": {0: rope, 1: rope},
            "transformer_blocks.0": {"hidden_states": ContextParallelInput(split_dim=1, expected_dims=3,
                                                                           split_output=False)},
            "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3)}


class HunyuanVideo15SPProcessor:
    """HunyuanVideo 1.5's joint attention under Ulysses. The release processor masks with a square (valid query AND
    valid key) mask built from the local length, which Ulysses cannot gather; this one passes the key mask only
    (padded text keys out; text keys out on every process but the group's first). Rows of padded text queries then
    differ from the release's; they reach the video tokens through no key (padded keys are masked in every block).
    The rest is the release processor's computation."""

    _attention_backend = None
    _parallel_config = None

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.embeddings import apply_rotary_emb

        q, k, v = (f(hidden_states).unflatten(2, (attn.heads, -1)) for f in (attn.to_q, attn.to_k, attn.to_v))
        q, k = attn.norm_q(q), attn.norm_k(k)
        if image_rotary_emb is not None:
            q = apply_rotary_emb(q, image_rotary_emb, sequence_dim=1)
            k = apply_rotary_emb(k, image_rotary_emb, sequence_dim=1)
        n_text = 0
        if encoder_hidden_states is not None:
            eq, ek, ev = (f(encoder_hidden_states).unflatten(2, (attn.heads, -1))
                          for f in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj))
            if attn.norm_added_q is not None:
                eq = attn.norm_added_q(eq)
            if attn.norm_added_k is not None:
                ek = attn.norm_added_k(ek)
            q, k, v = torch.cat([q, eq], 1), torch.cat([k, ek], 1), torch.cat([v, ev], 1)
            n_text = encoder_hidden_states.shape[1]
        b, seq = q.shape[:2]
        keys = torch.nn.functional.pad(attention_mask.bool(), (seq - attention_mask.shape[1], 0), value=True)
        cp = self._parallel_config.context_parallel_config if self._parallel_config is not None else None
        if cp is not None and cp._ulysses_local_rank != 0 and n_text:
            keys = keys.clone()
            keys[:, seq - n_text:] = False  # the text keys count once, on the group's first process
        out = dispatch_attention_fn(q, k, v, attn_mask=keys.view(b, 1, 1, seq), dropout_p=0.0, is_causal=False,
                                    backend=self._attention_backend, parallel_config=self._parallel_config)
        out = out.flatten(2, 3).to(q.dtype)
        if encoder_hidden_states is None:
            return out
        out, enc = out[:, :-n_text], out[:, -n_text:]
        if getattr(attn, "to_out", None) is not None:
            out = attn.to_out[1](attn.to_out[0](out))
        if getattr(attn, "to_add_out", None) is not None:
            enc = attn.to_add_out(enc)
        return out, enc


UNSUPPORTED = {
    "ltx2": "diffusers 0.42's LTX-2 context-parallel path fails on the tiny LTX-2 (a rotary-embedding shape mismatch "
            "in apply_split_rotary_emb, 2 CPU processes); not supported here",
}


def _transformers(adapter) -> list[torch.nn.Module]:
    experts = getattr(adapter, "experts", None)  # Wan2.2 A14B: both experts
    return list(experts.values()) if experts else [adapter.transformer]


OWN_PLANS = {"hunyuan_video15": (_hunyuan_video15_plan, HunyuanVideo15SPProcessor)}  # kind: (plan, processor)


def check_supported(adapter, degree: int) -> None:
    """``ValueError`` naming the reason when ``adapter`` cannot run sequence parallel over ``degree`` processes."""
    if degree < 2:
        raise ValueError(f"sequence-parallel degree must be >= 2, got {degree}")
    if adapter.kind in UNSUPPORTED:
        raise ValueError(f"model.kind={adapter.kind}: {UNSUPPORTED[adapter.kind]}")
    for tr in _transformers(adapter):
        if getattr(tr, "_cp_plan", None) is None and adapter.kind not in OWN_PLANS:
            raise ValueError(f"{type(tr).__name__} has no context-parallel plan (_cp_plan) in this diffusers: "
                             f"model.kind={adapter.kind} cannot run sequence parallel")
        heads = tr.config.num_attention_heads
        if heads % degree:
            raise ValueError(f"{type(tr).__name__}: {heads} attention heads are not divisible by degree {degree}")


def enable_sequence_parallel(adapter, degree: int, mesh=None) -> None:
    """Shard the adapter's transformer(s) over a ``degree``-rank Ulysses group (the whole process group unless
    ``mesh``, a ("ring", "ulysses") ``DeviceMesh``, is given). Every rank calls it, before any DDP/FSDP wrapping;
    LoRA may already be attached (the test does).
    Without an accelerator (the CPU tests) the mesh is built on CPU: diffusers' own resolution assumes a device."""
    import torch.distributed as dist
    from diffusers import ContextParallelConfig
    from diffusers.models._modeling_parallel import ParallelConfig

    check_supported(adapter, degree)
    if not dist.is_initialized():
        raise RuntimeError("sequence parallelism needs an initialised torch.distributed process group")
    on_cpu = torch.accelerator.device_count() == 0  # a CUDA build without a device counts as CPU
    if mesh is None and on_cpu:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (dist.get_world_size() // degree, degree), mesh_dim_names=("ring", "ulysses"))
    for tr in _transformers(adapter):
        cp = ContextParallelConfig(ulysses_degree=degree, mesh=mesh)
        if on_cpu:
            def resolve(config, tr=tr):  # diffusers' resolution divides by the accelerator count
                config = ParallelConfig(context_parallel_config=config)
                config.setup(dist.get_rank(), dist.get_world_size(), torch.device("cpu"), mesh=mesh)
                tr._parallel_config = config
                return config

            tr._resolve_parallel_config = resolve
        own = OWN_PLANS.get(adapter.kind)
        if own is not None:
            plan, processor = own
            for blk in tr.transformer_blocks:
                blk.attn.set_processor(processor())
        tr.enable_parallelism(config=cp, cp_plan=plan() if own is not None else None)


def sum_gradients(params: Iterable[torch.nn.Parameter], group: Optional[object] = None) -> None:
    """All-reduce (sum) the gradients of ``params`` over the sequence-parallel ``group``: each rank's gradient is its
    token shard's contribution, the sum is the gradient of the whole sequence."""
    import torch.distributed as dist

    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
