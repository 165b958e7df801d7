"""A tiny random Qwen2.5-VL (in memory) and a scripted rollout backend for the multi-turn tests."""
import types

import pytest
import torch

torch.set_num_threads(1)  # the machine is shared


@pytest.fixture(scope="session")  # built once (~6 CPU-s): no test changes it
def tiny():
    from mmgrpo.vlm.models.tiny import build_tiny_model, synthetic_image, vision_token_ids

    model, proc = build_tiny_model("qwen2_5_vl")
    img = synthetic_image(3, 84, 112)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "which colour?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    item = {k: v for k, v in proc(text=[text], images=[img], return_tensors="pt").items()
            if isinstance(v, torch.Tensor)}
    return types.SimpleNamespace(model=model, proc=proc, tok=proc.tokenizer, img=img, msgs=msgs, item=item,
                                 suppress=vision_token_ids(proc.tokenizer))


class Scripted:
    """RolloutBackend stand-in: call k returns ``script[k]`` (text, or a callable(row) -> text) + <|im_end|> for
    every row, with the model's own log-probs of those tokens (as if sampled), or delegates calls past the script
    to ``then``. Records the items and raw prompts it got."""

    def __init__(self, tiny, script, then=None):
        self.t, self.script, self.then, self.calls = tiny, list(script), then, []

    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None):
        from mmgrpo.vlm.models.rollout import (RolloutOutput, collate_prompts, compute_token_logprobs)

        k = len(self.calls)
        self.calls.append((prompts, raw_prompts, params, seeds))
        if k >= len(self.script):
            return self.then.generate(prompts, num_generations, params, seeds=seeds, raw_prompts=raw_prompts)
        tok, G = self.t.tok, num_generations
        rows = [p for p in prompts for _ in range(G)]
        texts = [self.script[k](r) if callable(self.script[k]) else self.script[k] for r in range(len(rows))]
        seqs = [tok(x, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
                for x in texts]
        T = max(map(len, seqs))
        ids = torch.full((len(rows), T), tok.pad_token_id)
        mask = torch.zeros(len(rows), T, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, :len(s)], mask[r, :len(s)] = torch.tensor(s), 1
        with torch.no_grad():
            lp = compute_token_logprobs(self.t.model, collate_prompts(rows, tok.pad_token_id), ids, mask, 1.0,
                                        self.t.suppress)
        return RolloutOutput(ids, mask, texts, torch.zeros(len(rows), dtype=torch.bool), lp,
                             torch.arange(len(prompts)).repeat_interleave(G))

    def sync_weights(self, model):
        pass


@pytest.fixture(scope="module")
def scripted():
    return Scripted


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from mmgrpo.vlm.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_tools") / "qwen2_5_vl", "qwen2_5_vl")


class ForcedFirstTurn:
    """Wraps the trainer's backend: the first turn (G > 1 rows per prompt) of row g is ``texts[g % len]``, scored by
    the policy (as if sampled: the step-0 on-policy check holds); later turns (one row per prompt) sample through
    the wrapped backend. A random tiny model never writes a tool call by itself."""

    def __init__(self, inner, policy, texts):
        self.inner, self.policy, self.texts = inner, policy, list(texts)

    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None):
        if num_generations == 1:
            return self.inner.generate(prompts, 1, params, seeds=seeds, raw_prompts=raw_prompts)
        t = types.SimpleNamespace(model=self.policy.model, tok=self.policy.processor.tokenizer,
                                  suppress=self.policy.suppress_token_ids)
        G = num_generations
        return Scripted(t, [lambda r: self.texts[(r % G) % len(self.texts)]]).generate(prompts, G, params, seeds)

    def sync_weights(self, model):
        pass


@pytest.fixture(scope="session")
def forced():
    return ForcedFirstTurn


def _samples(n):
    from mmgrpo.vlm.models.tiny import synthetic_image

    return [{"id": f"i{i}", "task": "mcq", "query": "which colour?", "image": synthetic_image(i, 56, 56),
             "options": ["red", "green", "blue"], "answer": "B"} for i in range(n)]


def _reward(texts, samples):
    """Deterministic, varies within a group: (sum of code points mod 7) / 6."""
    acc = torch.tensor([float(sum(map(ord, t)) % 7) / 6.0 for t in texts])
    return {"acc": acc, "total": acc.clone(), "parse_failed": torch.zeros(len(texts), dtype=torch.bool)}


def _cfg(tmp_path, model_dir, *over):
    """A small trainer config with tools on (tiny model, 2 prompts x G=4, 6 new tokens per turn, 2 turns)."""
    from mmgrpo.utils.config import load_config
    from mmgrpo.vlm.config import TrainConfig

    base = [f"model.path={model_dir}", "model.dtype=float32", "data.task=mcq", "data.prompt_mode=no_think",
            "data.image_min_pixels=3136", "data.image_max_pixels=3136", "rollout.group_size=4",
            "rollout.max_new_tokens=6", "run.max_steps=2", "run.prompts_per_device=2", "run.micro_batch_size=8",
            "optim.lr=0.01", "optim.weight_decay=0", "optim.max_grad_norm=0", f"run.output_dir={tmp_path / 'run'}",
            "run.tensorboard=false", "run.save_every=0", "run.resume_from=none", "tools.enabled=true",
            "tools.names=[crop]", "tools.max_turns=2", "tools.max_total_tokens=200", "tools.crop_pixels=3136"]
    return load_config(TrainConfig, None, base + list(over))


@pytest.fixture(scope="session")
def kit():
    return types.SimpleNamespace(cfg=_cfg, samples=_samples, reward=_reward)
