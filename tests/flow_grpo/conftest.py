"""Shared fixtures for the flow_grpo tests: tiny pipelines (built in ms), a toy reward, 1 torch thread.

The machine has 2 cores shared by several people; torch's default intra-op threading makes the tiny models
~8x slower under contention, so the flow_grpo tests run single-threaded."""
import pytest
import torch

torch.set_num_threads(1)

H = W = 64  # tiny VAE has scale factor 8 -> 8x8 latents (FLUX: 16 packed tokens)


def brightness_reward(images, prompts, metadata):
    """Toy reward: mean brightness in [0, 1] (stands in for flow_grpo.rewards until it exists)."""
    x = torch.as_tensor(images).float()
    return {"brightness": x.mean(dim=(1, 2, 3)) / 255.0}


def block_reward(images, prompts, metadata):
    """Toy reward sensitive to the noise seed: mean of the top-left 8x8 block in [0, 1] (the tiny model's global
    brightness barely depends on x_T, so tests that must tell two x_T apart use this one)."""
    x = torch.as_tensor(images).float()
    return {"block": x[:, :8, :8].mean(dim=(1, 2, 3)) / 255.0}


@pytest.fixture
def toy_reward():
    return brightness_reward


def make_adapter(kind: str, lora: bool = True, seed: int = 0):
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models.tiny import build_tiny_flux_pipeline, build_tiny_sd3_pipeline

    pipe = build_tiny_sd3_pipeline(seed) if kind == "sd3" else build_tiny_flux_pipeline(seed)
    ad = adapter_from_pipeline(pipe, max_sequence_length=16)
    if lora:
        torch.manual_seed(seed + 1)
        ad.add_lora(rank=4, alpha=8)
    return ad


# ------------------------------------------------------------------------------------------------ pipeline equality
# The setup shared by the adapter tests (test_models_{wan,wan_i2v,qwen_image,t5_kontext}.py): a tiny pipeline of a
# kind wrapped in its adapter, our explicit ODE loop, and the pipeline's float frames as uint8.
def tiny_adapter(kind: str, seed: int = 0, builder_kwargs=None, **adapter_kwargs):
    """The adapter over ``TINY_BUILDERS[kind](seed, **builder_kwargs)`` (``adapter_kwargs``: e.g. num_frames)."""
    from flow_grpo.models import adapter_from_pipeline
    from flow_grpo.models import TINY_BUILDERS

    return adapter_from_pipeline(TINY_BUILDERS[kind](seed=seed, **(builder_kwargs or {})), **adapter_kwargs)


def tiny_ode(ad, emb, seeds, gs, cfg, steps, height, width):
    """Our explicit loop: the adapter's sigmas and velocity, the Euler step of the SDE kernel (kind='ode')."""
    from flow_grpo.sde import sde_step

    ad.set_resolution(height, width)
    x = ad.initial_noise(seeds, height, width)
    sig = ad.sigmas(steps, height, width)
    with torch.no_grad():
        for k in range(steps):
            v = ad.predict_velocity(x, sig[k].item(), emb, gs, cfg)
            x = sde_step(v, x, sig[k].item(), sig[k + 1].item(), kind="ode").prev_sample
    return x


def check_folder_roundtrip(roundtrip, tmp_path, kind, height, width, atol, perturb, gs, cfg,
                           parts=("transformer", "vae", "text_encoder"), seed=5, **adapter_kwargs):
    """``save_tiny_pipeline`` -> ``load_adapter`` (the path a full-size folder takes) against the in-memory tiny of the
    same seed: weights bitwise, a 3-step ODE within ``atol``, decoded media within one level; then ``perturb(adapter)``
    (a small weight change) must move the latents past ``atol`` (the tolerance catches a real bug). ``roundtrip``:
    the fixture of that name. Returns the measured distance."""
    from flow_grpo.models import load_adapter
    from flow_grpo.models import save_tiny_pipeline

    save_tiny_pipeline(str(tmp_path), kind=kind, seed=seed)
    ad = load_adapter(str(tmp_path), **adapter_kwargs)
    ref = tiny_adapter(kind, seed, **adapter_kwargs)
    assert ad.kind == ref.kind and type(ad.pipe) is type(ref.pipe)
    for part in parts:
        roundtrip.same_weights(getattr(ad.pipe, part), getattr(ref.pipe, part))
    x = tiny_ode(ad, ad.encode_prompts(["a cat"]), [1], gs, cfg, 3, height, width)
    x_ref = tiny_ode(ref, ref.encode_prompts(["a cat"]), [1], gs, cfg, 3, height, width)
    roundtrip.close(x, x_ref, atol=atol)
    roundtrip.images_close(ad.decode(x, height, width), ref.decode(x_ref, height, width))
    with torch.no_grad():
        perturb(ad)
    with pytest.raises(AssertionError, match="not close"):
        roundtrip.close(tiny_ode(ad, ad.encode_prompts(["a cat"]), [1], gs, cfg, 3, height, width), x_ref, atol=atol)
    return float((x - x_ref).abs().max())


def check_lora_reference(kind, height, width, gs, cfg, **adapter_kwargs):
    """With a non-zero LoRA, ``reference()`` gives the base model's velocity bit for bit, the LoRA another one."""
    base, ad = tiny_adapter(kind, 0, **adapter_kwargs), tiny_adapter(kind, 0, **adapter_kwargs)
    torch.manual_seed(1)
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    for a in (ad, base):
        a.set_resolution(height, width)
    x = ad.initial_noise([1, 2], height, width)
    with torch.no_grad():
        v_lora = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"]), gs, cfg)
        with ad.reference():
            v_ref = ad.predict_velocity(x, 0.5, ad.encode_prompts(["a", "b"]), gs, cfg)
        v_base = base.predict_velocity(x, 0.5, base.encode_prompts(["a", "b"]), gs, cfg)
    assert torch.equal(v_ref, v_base) and not torch.allclose(v_lora, v_base)
    return ad


def as_uint8(np_media):
    """A pipeline's ``output_type="np"`` floats in [0, 1] as the uint8 the adapters' ``decode`` returns."""
    return torch.from_numpy((np_media * 255).round()).to(torch.uint8)


def train_overrides(kind: str, method: str, out, **extra) -> list[str]:
    """Tiny-run overrides (64 px, 4 steps, 2x2 samples, LoRA r=4) shared by the trainer tests."""
    ov = {
        "method": method, "sample.num_steps": 4, "sample.height": H, "sample.width": W, "sample.batch_size": 4,
        "sample.window_size": 2, "sample.window_range": "[0,3]", "sample.single_steps": "[0,1,2]",
        "sample.cfg": "true" if kind == "sd3" else "false", "sample.guidance_scale": 4.5 if kind == "sd3" else 3.5,
        "data.group_size": 2, "data.groups_per_epoch": 2, "data.prompts": "[a cat, a dog, a bird]",
        "model.lora.rank": 4, "model.lora.alpha": 8, "optim.lr": 1e-2, "optim.clip_low": 0.2,
        "run.num_epochs": 1, "run.output_dir": str(out), "run.save_every": 0, "run.image_grid_every": 0,
        "run.tensorboard": "false", "run.reward_curves": "false", "ema.update_every": 1, "ema.decay": 0.5, "reward.retry_backoff": 0.0,
    }
    ov.update(extra)
    return [f"{k}={v}" for k, v in ov.items()]


def make_trainer(kind: str, method: str, out, rewards=None, **extra):
    """A FlowGRPOTrainer on a tiny pipeline with injected reward components (default: ``block``)."""
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    cfg = load_train_config(None, train_overrides(kind, method, out, **extra))
    return FlowGRPOTrainer(cfg, adapter=make_adapter(kind, lora=False), reward_fn=rewards or {"block": block_reward})


# ------------------------------------------------------------------------------------------------ multi-process
# Cases run by _dist_worker.py under `torch.distributed.run --nproc_per_node 2` (CPU, gloo) and, with one process,
# in the test itself. 3 groups of G over 2 processes -> 3G/2 samples per process: with G = 2 or 4, group 1 is split
# across the processes. Rollout chunks of 3 give both runs the same chunk boundaries (bit-identical first rollouts).
DIST_PROMPTS = ["a cat", "a dog", "a bird"]


def dist_nan_prompt(seed: int = 42) -> str:
    """The prompt of group 1 in epoch 0 (the group split across the 2 processes): its samples get NaN rewards."""
    from mmgrpo.utils.seeding import sample_seed

    order = torch.randperm(len(DIST_PROMPTS), generator=torch.Generator().manual_seed(sample_seed(seed, 0, 0)))
    return DIST_PROMPTS[int(order[1])]


def dist_case(case: str, out) -> tuple[list[str], dict]:
    """(overrides, reward components) of a multi-process test case: ddp | win_rate | fsdp."""
    # optim.eps=1e-3: Adam's first steps are ~lr*sign(g) for |g| >> eps, which would turn float-order noise in
    # near-zero gradient entries into lr-sized weight differences; with eps above |g| the update is ~lr*g/eps and
    # the 1- vs 2-process comparison is well conditioned.
    base = {"data.group_size": 2, "data.groups_per_epoch": 3, "sample.batch_size": 3, "optim.eps": 1e-3,
            "data.prompts": "[" + ", ".join(DIST_PROMPTS) + "]", "run.save_every": 1, "run.keep_last": 5,
            "run.device": "cpu"}
    if case == "ddp":
        bad = dist_nan_prompt()

        def nanny(images, prompts, metadata):
            r = block_reward(images, prompts, metadata)["block"].double()
            return {"nanny": torch.where(torch.tensor([p == bad for p in prompts]), float("nan"), r)}

        extra = {"run.num_epochs": 2, "reward.weights": "{block: 1.0, nanny: 0.5}", "run.eval_every": 1,
                 "data.eval_prompts": "[a red cube, a cat, a tree]", "optim.kl_coef": 0.01}
        rewards = {"block": block_reward, "nanny": nanny}
    elif case == "win_rate":
        extra = {"run.num_epochs": 1, "reward.mode": "win_rate", "data.group_size": 4}  # 12 samples: group 1 split
        rewards = {"block": block_reward}
    elif case == "fsdp":
        extra = {"run.num_epochs": 2, "model.lora.enabled": "false", "optim.lr": 1e-3}
        rewards = {"block": block_reward}
    else:
        raise ValueError(case)
    base.update(extra)
    return train_overrides("flux", "fast", out, **base), rewards


# ------------------------------------------------------------------------------------------------ sequence parallel
def sp_train_case(out, sp: int, epochs: int, resume_from=None, accelerator=None, dump=None, kind="wan", **extra):
    """The trainer on a tiny Wan (``kind``: wan = Wan2.1, wan22 = Wan2.2 A14B, both experts; LoRA, 2 groups of 2,
    4 steps, CFG) at ``run.sequence_parallel=sp`` up to epoch ``epochs`` (resumed from ``resume_from`` if given), in
    this process group; the reward (a block of every frame) counts its calls. ``dump(run, traj)`` runs after each
    epoch's updates. Returns (trainer, history, calls) (_sp_worker.py on 2 processes, test_sequence_parallel.py on
    one)."""
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer
    import flow_grpo.train.trainer as T

    calls = [0]

    def video_block(videos, prompts, metadata):
        calls[0] += 1
        return {"vblock": torch.as_tensor(videos).float()[:, :, :8, :8].mean(dim=(1, 2, 3, 4)) / 255.0}

    ov = {"model.tiny": kind, "sample.num_frames": 5, "sample.height": 32, "sample.width": 32,
          "sample.guidance_scale": 5.0, "sample.cfg": "true", "model.max_sequence_length": 16, "optim.eps": 1e-3,
          "reward.weights": "{vblock: 1.0}", "run.num_epochs": epochs, "run.save_every": 1, "run.keep_last": 5,
          "run.device": "cpu", "run.sequence_parallel": sp, "optim.kl_coef": 0.01, "run.eval_every": 1,
          "data.eval_prompts": "[a red cube, a cat]",
          **({"run.resume_from": str(resume_from)} if resume_from is not None else {}), **extra}
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("wan", "flow", out, **ov)),
                         reward_fn={"vblock": video_block}, accelerator=accelerator)
    orig = T.epoch_metrics

    def metrics_and_dump(traj, *a, **k):
        if dump is not None:
            dump(tr, traj)
        return orig(traj, *a, **k)

    T.epoch_metrics = metrics_and_dump
    try:
        hist = tr.train()
    finally:
        T.epoch_metrics = orig
    return tr, hist, calls[0]


# ------------------------------------------------------------------------------------------------ every preset, 2 processes
# test_distributed_presets.py: every preset trains PRESET_EPOCHS epochs on 2 processes (_dist_presets_worker.py) and
# in one process; 2 groups of 2 per epoch = 1 group per process, so per-group plans (fast, g2rpo, tp_grpo, vgpo) and
# per-sample plans (dance) give the processes different trained steps in most epochs (issue 31, item 3).
PRESET_EPOCHS = 6
PRESET_CASES = [  # (name, preset, extra overrides): every preset (flow_grpo/presets/*.yaml) that runs on several processes
    ("flow", "flow", {}),
    ("dance", "dance", {}),
    ("fast", "fast", {}),
    ("mix", "mix", {"sample.window_shift_every": 1}),
    ("mix_flash", "mix_flash", {"sample.window_shift_every": 1}),
    ("tp_grpo", "tp_grpo", {}),
    ("g2rpo", "g2rpo", {}),
    ("vgpo", "vgpo", {}),
    ("nft", "nft", {}),
    # 4 leaves per tree (splits at steps 0 and 1): one tree per process; width pruning gathers (N, K) cells
    ("branch_grpo", "branch_grpo", {"data.group_size": 4, "methods.branch_grpo.split_points": "[0,1]",
                                    "methods.branch_grpo.width_pruning": 1}),
    ("b2", "b2", {}),
]
NOT_MULTI_PROCESS = {"adv_grpo"}  # refuses more than one process (its reward model is updated from local images)


def run_preset_case(name: str, out) -> list[dict]:
    """Train preset case ``name`` (tiny FLUX, LoRA) for PRESET_EPOCHS epochs in this process group; returns the
    numeric metrics of every epoch."""
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    _, preset, extra = next(c for c in PRESET_CASES if c[0] == name)
    ov = {"data.group_size": 2, "data.groups_per_epoch": 2, "sample.batch_size": 2, "optim.eps": 1e-3,
          "data.prompts": "[a cat, a dog, a bird, a fish]", "run.num_epochs": PRESET_EPOCHS, "run.device": "cpu",
          **extra}
    tr = FlowGRPOTrainer(load_train_config(None, train_overrides("flux", preset, out, **ov)),
                         adapter=make_adapter("flux", lora=False), reward_fn={"block": block_reward})
    try:
        hist = tr.train()
    finally:
        tr.close()
    return [{k: float(v) for k, v in h.items() if isinstance(v, (int, float))} for h in hist]


# ------------------------------------------------------------------------------------------------ background launches
# A 2-process launch is expensive (two interpreters importing torch/diffusers/transformers/peft): when a distributed
# test is collected, its launch is started in the background as soon as collection ends, so it overlaps the other
# tests; the test then waits for it. Only processes started here are ever killed (their own session).
DIST_JOBS = {  # name: (worker script, test module that waits for it)
    "main": ("_dist_worker.py", "test_trainer_distributed"),
    "presets": ("_dist_presets_worker.py", "test_distributed_presets"),
    "sp": ("_sp_worker.py", "test_sequence_parallel"),
}
_DIST_JOBS: dict = {}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dist_job(name: str = "main") -> dict:
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    if name in _DIST_JOBS:
        return _DIST_JOBS[name]
    out = Path(tempfile.mkdtemp(prefix=f"flow_grpo_dist_{name}_"))
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--nnodes", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
           str(Path(__file__).parent / DIST_JOBS[name][0]), str(out)]
    log = open(out / "launch.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _DIST_JOBS[name] = dict(proc=proc, out=out, log=log, t0=__import__("time").time())
    return _DIST_JOBS[name]


def _waits_for(item) -> bool:
    return any(mod in item.nodeid for _, mod in DIST_JOBS.values())


def pytest_collection_modifyitems(session, config, items):
    # the tests that wait for a background launch run last, so the launches overlap as many tests as possible
    dist = [it for it in items if _waits_for(it)]
    if dist:
        items[:] = [it for it in items if it not in dist] + dist


def pytest_collection_finish(session):
    for name, (_, mod) in DIST_JOBS.items():
        if any(mod in item.nodeid for item in session.items):
            start_dist_job(name)


def pytest_sessionfinish(session, exitstatus):
    import os
    import shutil
    import signal

    for job in _DIST_JOBS.values():
        proc = job["proc"]
        if proc.poll() is None:  # e.g. the run stopped early (-x): end the job we started, and only it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        job["log"].close()
        shutil.rmtree(job["out"], ignore_errors=True)
