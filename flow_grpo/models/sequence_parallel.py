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
models have plans too, untested here); HunyuanVideo 1.5's transformer has no plan in diffusers 0.42 and LTX-2's
fails (both refused; docs/generators.md, "Sequence parallelism: HunyuanVideo 1.5 and LTX-2", says what a plan of
our own needs). Token and head counts must be divisible by the degree.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch


UNSUPPORTED = {
    "ltx2": "diffusers 0.42's LTX-2 context-parallel path fails on the tiny LTX-2 (a rotary-embedding shape mismatch "
            "in apply_split_rotary_emb, 2 CPU processes); not supported here",
}


def _transformers(adapter) -> list[torch.nn.Module]:
    experts = getattr(adapter, "experts", None)  # Wan2.2 A14B: both experts
    return list(experts.values()) if experts else [adapter.transformer]


def check_supported(adapter, degree: int) -> None:
    """``ValueError`` naming the reason when ``adapter`` cannot run sequence parallel over ``degree`` processes."""
    if degree < 2:
        raise ValueError(f"sequence-parallel degree must be >= 2, got {degree}")
    if adapter.kind in UNSUPPORTED:
        raise ValueError(f"model.kind={adapter.kind}: {UNSUPPORTED[adapter.kind]}")
    for tr in _transformers(adapter):
        if getattr(tr, "_cp_plan", None) is None:
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
        tr.enable_parallelism(config=cp)


def sum_gradients(params: Iterable[torch.nn.Parameter], group: Optional[object] = None) -> None:
    """All-reduce (sum) the gradients of ``params`` over the sequence-parallel ``group``: each rank's gradient is its
    token shard's contribution, the sum is the gradient of the whole sequence."""
    import torch.distributed as dist

    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
