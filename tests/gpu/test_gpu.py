"""GPU-only checks (``pytest -m gpu``; every test skips without CUDA). Run by ``scripts/gpu_check.sh`` on the GPU
machine (docs/gpu_check.md); written and collected on the CPU machine, where they skip. Not yet run on a GPU.

* bf16 vs fp32 token log-probs at the released Qwen2.5-VL-7B width (2 layers, video prompt);
* the flow SDE step's on-policy ratio is 1 on CUDA (rollout log-probs recomputed by the training path);
* chunked token log-probs (``algo.logprob_chunk_size``) use a fraction of the full-logit memory on CUDA, same values;
* the shared-prefix group forward equals the naive one on CUDA (log-probs and gradients);
* a run SIGKILLed after a checkpoint and resumed ends with the weights of an uninterrupted run, bit for bit, on CUDA
  (deterministic algorithms on; CUDA RNG state in the checkpoint).
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run by scripts/gpu_check.sh)")]
REPO = Path(__file__).resolve().parents[2]


def _text_ids(cfg, n: int, g) -> torch.Tensor:
    """``n`` random ids of ordinary tokens: below the first vision special token (Qwen's specials follow the BPE
    ranks; the tiny tokenizer's come first, so there the ids above them)."""
    special = [cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.video_token_id, cfg.image_token_id]
    lo, hi = (0, min(special)) if min(special) > 1000 else (max(special) + 1, cfg.text_config.vocab_size)
    return torch.randint(lo, hi, (n,), generator=g)


def _video_batch(cfg, device, n_text: int = 40, grid=(2, 8, 8), seed: int = 0):
    """A prompt with one video (grid t x h x w patches, merge 2 -> t h w / 4 tokens) in the model's token ids, without
    a processor: ordinary text ids, the video placeholder run, random pixel patches."""
    g = torch.Generator().manual_seed(seed)
    t, h, w = grid
    n_vid = t * h * w // 4
    ids = torch.cat([_text_ids(cfg, n_text // 2, g), torch.tensor([cfg.vision_start_token_id]),
                     torch.full((n_vid,), cfg.video_token_id), torch.tensor([cfg.vision_end_token_id]),
                     _text_ids(cfg, n_text // 2, g)])[None]
    patch = 3 * 2 * 14 * 14
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device),
            "pixel_values_videos": torch.randn(t * h * w, patch, generator=g).to(device),
            "video_grid_thw": torch.tensor([list(grid)]).to(device),
            "second_per_grid_ts": torch.tensor([1.0]).to(device)}


def test_bf16_vs_fp32_logprobs_at_real_width():
    from mmgrpo.utils.memory_plan import get_spec
    from mmgrpo.vlm.memory_plan import vlm_config
    from mmgrpo.vlm.models.rollout import compute_token_logprobs
    from mmgrpo.vlm.models.tiny import model_class

    spec = get_spec("qwen2.5-vl-7b")
    cfg = vlm_config(spec, 2)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_class(spec["family"])(cfg).eval()
    batch = _video_batch(cfg, "cuda")
    comp = _text_ids(cfg, 4 * 32, torch.Generator().manual_seed(1)).view(4, 32).cuda()
    mask = torch.ones_like(comp)
    rows = {k: v.repeat(4, *[1] * (v.ndim - 1)) if k in ("input_ids", "attention_mask") else v for k, v in batch.items()}
    rows["pixel_values_videos"] = batch["pixel_values_videos"].repeat(4, 1)
    rows["video_grid_thw"] = batch["video_grid_thw"].repeat(4, 1)
    rows["second_per_grid_ts"] = batch["second_per_grid_ts"].repeat(4)
    with torch.no_grad():
        lp32 = compute_token_logprobs(model, rows, comp, mask)
        model.to(torch.bfloat16)
        lp16 = compute_token_logprobs(model, rows, comp, mask)
    assert lp32.dtype == torch.float32 and lp16.dtype == torch.float32  # log-probs are fp32 in both
    d = (lp16 - lp32).abs()
    # random weights give near-uniform next-token distributions (log-prob ~ -log V = -11.9): bf16 must stay close
    assert torch.isfinite(lp16).all() and float(lp32.mean()) < -5
    assert float(d.mean()) < 0.02 and float(d.max()) < 0.5, (float(d.mean()), float(d.max()))


def test_sde_ratio_is_one_on_cuda():
    from flow_grpo.config import SamplingConfig
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models.tiny import build_tiny_flux_pipeline
    from flow_grpo.sampler import sample_trajectories, score_column

    ad = adapter_from_pipeline(build_tiny_flux_pipeline(0), device="cuda", dtype=torch.bfloat16,
                               max_sequence_length=32)
    cfg = SamplingConfig(num_steps=6, height=64, width=64, guidance_scale=3.5, cfg=False, sde_kind="cps",
                         noise_level=0.8, step_mode="all", batch_size=4)
    n = 4
    traj = sample_trajectories(ad, ["a cat"] * n, cfg, list(range(n)), [100 + i for i in range(n)], [7] * n, [0] * n)
    ratios = []
    with torch.no_grad():
        for c0, c1 in traj.chunks:
            for col in range(traj.latents.shape[1]):
                out = score_column(ad, traj, (c0, c1), col)
                ratios.append(torch.exp(out.log_prob.float() - traj.log_probs[c0:c1, col].float()))
    r = torch.cat([x.flatten() for x in ratios])
    assert r.numel() == n * (cfg.num_steps - 1)
    assert float((r - 1).abs().max()) == 0.0  # same chunks, same kernels: the recomputation is the rollout's


def test_chunked_logprob_memory_on_cuda():
    from mmgrpo.utils.memory_plan import get_spec
    from mmgrpo.vlm.memory_plan import vlm_config
    from mmgrpo.vlm.models.rollout import compute_token_logprobs
    from mmgrpo.vlm.models.tiny import model_class

    cfg = vlm_config(get_spec("qwen2.5-vl-7b/28"), 1)  # the real 152k vocabulary, narrow layers: logits dominate
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = model_class("qwen2_5_vl")(cfg)
    batch = {k: v for k, v in _video_batch(cfg, "cuda").items()}
    R, T = 8, 512
    rows = {"input_ids": batch["input_ids"].repeat(R, 1), "attention_mask": batch["attention_mask"].repeat(R, 1),
            "pixel_values_videos": batch["pixel_values_videos"].repeat(R, 1),
            "video_grid_thw": batch["video_grid_thw"].repeat(R, 1),
            "second_per_grid_ts": batch["second_per_grid_ts"].repeat(R)}
    comp = _text_ids(cfg, R * T, torch.Generator().manual_seed(2)).view(R, T).cuda()
    mask = torch.ones_like(comp)
    peaks, grads, lps = {}, {}, {}
    for chunk in (0, 64):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        lp = compute_token_logprobs(model, rows, comp, mask, chunk_size=chunk)
        lp.sum().backward()
        torch.cuda.synchronize()
        peaks[chunk] = torch.cuda.max_memory_allocated() - base
        lps[chunk] = lp.detach()
        grads[chunk] = model.lm_head.weight.grad.detach().clone()
    torch.testing.assert_close(lps[64], lps[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(grads[64], grads[0], atol=1e-5, rtol=1e-4)
    full_logits = R * T * cfg.text_config.vocab_size * 4
    assert peaks[0] > full_logits  # the full path holds (R, T, V) fp32 logits at least once
    assert peaks[64] < peaks[0] / 4, peaks


def test_prefix_shared_equals_naive_on_cuda(tmp_path):
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.prefix_group import grouped_rows_token_logprobs
    from mmgrpo.vlm.models.rollout import collate_prompts, compute_token_logprobs
    from mmgrpo.vlm.models.tiny import save_tiny_model

    path = save_tiny_model(tmp_path / "m", "qwen2_5_vl")
    pol = load_policy(path, dtype="float32", device="cuda")
    cfg = pol.model.config
    item = {k: v.cpu() for k, v in _video_batch(cfg, "cpu", n_text=8, grid=(2, 4, 4)).items()}
    G, T = 4, 12
    comp = _text_ids(cfg, G * T, torch.Generator().manual_seed(3)).view(G, T)
    mask = torch.ones_like(comp)
    mask[1, 7:] = 0
    grads = {}
    for impl in ("naive", "grouped"):
        pol.model.zero_grad(set_to_none=True)
        if impl == "naive":
            b = {k: v.cuda() for k, v in collate_prompts([item] * G, pol.tokenizer.pad_token_id).items()}
            lp = compute_token_logprobs(pol.model, b, comp.cuda(), mask.cuda())
        else:
            lp = grouped_rows_token_logprobs(pol.model, [item] * G, comp, mask, pol.tokenizer.pad_token_id,
                                             device="cuda")
        (lp * mask.cuda()).sum().backward()
        grads[impl] = (lp.detach(), {n: p.grad.detach().clone() for n, p in pol.model.named_parameters()
                                     if p.grad is not None})
    torch.testing.assert_close(grads["grouped"][0] * mask.cuda(), grads["naive"][0] * mask.cuda(), atol=1e-4, rtol=0)
    for n, g in grads["naive"][1].items():
        torch.testing.assert_close(grads["grouped"][1][n], g, atol=1e-4, rtol=1e-3)


_CHILD = textwrap.dedent("""
    import os, sys, json, torch
    torch.use_deterministic_algorithms(True, warn_only=True)  # no deterministic kernel: a warning, then the check
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.vlm.models.tiny import synthetic_frames
    from mmgrpo.vlm.train.trainer import GRPOTrainer
    model, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cfg = load_config(TrainConfig, None, [f"model.path={model}", "model.dtype=float32", "data.task=tvg",
        "data.prompt_mode=no_think", "data.video_min_pixels=3136", "data.video_max_pixels=3136",
        "rollout.group_size=4", "rollout.max_new_tokens=6", f"run.max_steps={steps}", "run.prompts_per_device=2",
        "run.micro_batch_size=8", "optim.lr=0.01", f"run.output_dir={out}", "run.tensorboard=false",
        "run.save_every=1", "run.keep_last=2", "run.resume_from=auto", "run.device=cuda", "run.progress_bar=false"])
    samples = [{"id": f"v{i}", "task": "tvg", "query": "a square moves", "video": synthetic_frames(i, 4, 56, 56),
                "meta": {"video_fps": 2.0}, "duration": 2.0, "spans": [[0.5, 1.5]]} for i in range(4)]
    def reward(texts, s):
        acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
        return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}
    tr = GRPOTrainer(cfg, samples=samples, reward_fn=reward)
    tr.train()
    torch.save({n: p.detach().cpu() for n, p in tr.model.named_parameters()}, os.path.join(out, "final.pt"))
""")


def _child(model, out, steps):
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(model), str(out), str(steps)], env=env, cwd=REPO)


def test_kill_and_resume_bitwise_with_cuda_rng(tmp_path):
    from mmgrpo.vlm.models.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "m", "qwen2_5_vl")
    ref = _child(model, tmp_path / "ref", 3)
    assert ref.wait(timeout=600) == 0
    run = _child(model, tmp_path / "run", 3)
    ck = tmp_path / "run" / "checkpoints"
    t0 = time.time()
    while not (ck / "step-00000002").exists() and run.poll() is None:
        assert time.time() - t0 < 600
        time.sleep(0.05)
    run.send_signal(signal.SIGKILL)  # after the step-2 checkpoint: step 3 was in progress (or done, not saved)
    run.wait()
    resumed = _child(model, tmp_path / "run", 3)
    assert resumed.wait(timeout=600) == 0
    a = torch.load(tmp_path / "ref" / "final.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "final.pt", weights_only=True)
    assert a.keys() == b.keys()
    bad = [n for n in a if not torch.equal(a[n], b[n])]
    assert not bad, f"{len(bad)} tensors differ after kill + resume, e.g. {bad[:3]}"
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3
