"""Worker for the opt-in two-process test (tests/trainer/test_cli_multiproc.py); run by subprocess."""
import os, sys, json, torch
torch.set_num_threads(1)
from mmgrpo.config import TrainConfig
from mmgrpo.utils.config import load_config
from mmgrpo.train.trainer import GRPOTrainer
from mmgrpo.models.tiny import synthetic_image

model_dir, out_dir, ppd, mbs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
samples = [{"id": f"i{i}", "task": "mcq", "query": "which colour?", "image": synthetic_image(i, 56, 56),
            "options": ["red", "green", "blue"], "answer": "B"} for i in range(4)]
def text_reward(texts, samples):
    acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}
cfg = load_config(TrainConfig, None, [f"model.path={model_dir}", "model.dtype=float32", "data.task=mcq",
    "data.prompt_mode=no_think", "data.image_min_pixels=3136", "data.image_max_pixels=3136",
    "rollout.num_generations=4", "rollout.max_new_tokens=5", "run.max_steps=1", f"run.prompts_per_device={ppd}",
    f"run.micro_batch_size={mbs}", "optim.lr=0.01", "optim.weight_decay=0", f"run.output_dir={out_dir}",
    "run.use_tensorboard=false", "run.resume_from=none", "model.lora.enabled=true", "model.lora.r=2"])
tr = GRPOTrainer(cfg, samples=samples, reward_fn=text_reward)
tr.train()
if tr.accelerator.is_main_process:
    torch.save(tr.policy.trainable_state_dict(), os.path.join(out_dir, "final.pt"))
    print("WORLD", tr.world, "rows", tr.last_batch.n)
