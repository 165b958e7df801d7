"""The trainer hands each prompt to the rollout backend ONCE with its number of generations (issue #18 item 4), so
``rollout.shared_prefix`` (one prefill per prompt) is what a training step actually runs; samples, log-probs and
the update are those of the repeated-prompt path, and split groups keep their rows and seeds."""
import torch

from mmgrpo.vlm.models.rollout import RolloutOutput
from mmgrpo.vlm.train.trainer import GRPOTrainer
from mmgrpo.utils.seeding import sample_seed
from mmgrpo.vlm.train import steps


class Recording:
    """Wraps a backend and records (number of prompts, num_generations, seeds) of every ``generate`` call."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None):
        self.calls.append((len(prompts), num_generations, list(seeds)))
        return self.inner.generate(prompts, num_generations, params, seeds=seeds, raw_prompts=raw_prompts)

    def sync_weights(self, model):
        pass


def _trainer(tmp_path, tiny_dirs, th, *over):
    cfg = th.make_cfg(tmp_path, tiny_dirs("qwen2_5_vl"), "run.max_steps=1", "rollout.max_new_tokens=8", *over)
    tr = GRPOTrainer(cfg, samples=th.video_samples(2) + th.image_samples(2), reward_fn=th.text_reward)
    tr.backend = Recording(tr.backend)
    tr.state.stream = tr.new_stream()
    return tr


def _vision_patches(model):
    seen = []
    visual = model.model.visual if hasattr(model, "model") else model.visual
    h = visual.register_forward_pre_hook(lambda m, a, kw: seen.append(int(a[0].shape[0])), with_kwargs=True)
    return seen, h


def test_one_prefill_per_prompt_and_same_step_as_repeated(tmp_path, tiny_dirs, th):
    """A step with rollout.shared_prefix=true: one generate call with 2 prompts x G=4 (before: 8 prompts x 1), the
    vision tower sees each prompt's patches once while sampling; tokens, sampling log-probs and the updated
    weights equal those of the repeated path (rollout.shared_prefix=false) to float rounding."""
    runs = {}
    for shared in (True, False):
        tr = _trainer(tmp_path / str(shared), tiny_dirs, th, f"rollout.shared_prefix={str(shared).lower()}",
                      "run.logprob_impl=naive", "data.shuffle=false", "data.prefetch=0")
        seen, h = _vision_patches(tr.model)
        orig = tr.backend.inner.generate

        def gen(*a, _orig=orig, _seen=seen, **kw):  # count the vision patches of sampling only
            n0 = len(_seen)
            out = _orig(*a, **kw)
            gen.patches = sum(_seen[n0:])
            return out

        tr.backend.inner.generate = gen
        tr.train(steps=1)[-1]
        h.remove()
        rb = tr.state.batch
        prompt_patches = sum(int(it["pixel_values_videos" if "pixel_values_videos" in it else "pixel_values"]
                                 .shape[0]) for it in rb.items[::4])
        runs[shared] = dict(calls=tr.backend.calls, patches=gen.patches, prompt_patches=prompt_patches,
                            ids=rb.completion_ids, mask=rb.completion_mask, lp=rb.rollout_logp,
                            w={n: p.detach().clone() for n, p in tr.model.named_parameters() if p.requires_grad})
    s, r = runs[True], runs[False]
    assert [(n, g) for n, g, _ in s["calls"]] == [(2, 4)], s["calls"]
    assert s["calls"][0][2] == r["calls"][0][2]  # same seeds
    assert s["patches"] == s["prompt_patches"]  # each prompt's pixels through the vision tower once
    assert r["patches"] == 4 * r["prompt_patches"]
    assert torch.equal(s["ids"], r["ids"]) and torch.equal(s["mask"], r["mask"])
    assert float((s["lp"] - r["lp"]).abs().max()) < 1e-5
    for n, w in s["w"].items():
        assert torch.allclose(w, r["w"][n], atol=1e-6, rtol=1e-5), n


def test_split_groups_keep_rows_seeds_and_order(tmp_path, tiny_dirs, th):
    """Prompts owning different numbers of generations (a group split across processes) go in one call per
    count; every row keeps its seed f(seed, step, position, g) and its place (group-contiguous, in draw order)."""
    tr = _trainer(tmp_path, tiny_dirs, th)

    class Fake:  # token = seed % 50 + 1: the row's seed is visible in its output
        calls = []

        def generate(self, prompts, num_generations, params, seeds=None, raw_prompts=None):
            self.calls.append((len(prompts), num_generations))
            assert len(seeds) == len(prompts) * num_generations and len(raw_prompts) == len(prompts)
            ids = torch.tensor([[s % 50 + 1, 2] for s in seeds])
            n = len(seeds)
            return RolloutOutput(ids, torch.ones(n, 2, dtype=torch.long), [str(s) for s in seeds],
                                 torch.zeros(n, dtype=torch.bool), torch.zeros(n, 2),
                                 torch.arange(len(prompts)).repeat_interleave(num_generations))

    tr.backend = Fake()
    drawn = [(10, 0, [2, 3]), (11, 1, None), (12, 2, [0]), (13, 3, [1, 3])]
    rb = steps.rollout(tr, 5, tr.feed.prepare(drawn, tr.samples, tr.state.counters))
    assert sorted(Fake.calls) == [(1, 1), (1, 4), (2, 2)], Fake.calls
    want = [(pos, g) for pos, _, gens in drawn for g in (range(4) if gens is None else gens)]
    assert rb.group_ids.tolist() == [pos for pos, _ in want]
    assert rb.texts == [str(sample_seed(tr.cfg.run.seed, 5, pos, g)) for pos, g in want]
    assert rb.info["gen_tokens"] == 2.0 * len(want)
