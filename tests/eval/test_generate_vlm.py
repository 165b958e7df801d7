"""eval/generate_vlm.py end to end on CPU: tiny Qwen2.5-VL folders loaded through the CLI path, synthetic mp4s.

* a "crafted" tiny model whose greedy output is known ("2 to 7" for every prompt) makes the scored numbers
  checkable by hand (IoU of [2, 7] clamped to the video against the generator's ground-truth span);
* frame counts are checked against the fps-2 rule computed here from the generator's frame count and fps;
* resume: an interrupted run (max_batches + a torn last line) continued to the end writes the same bytes.
"""
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval import generate_vlm  # noqa: E402
from eval.harness import ResumableJsonl  # noqa: E402

torch.set_num_threads(1)

# small pixel bounds keep the tiny model fast; everything else is the training contract (fps 2, ...)
FAST = ["data.video_min_pixels=3136", "data.video_max_pixels=12544", "data.video_total_pixels=50176",
        "progress=false"]
TARGET = "2 to 7"


def _craft(src: str, dst: Path) -> str:
    """Copy of the tiny model whose greedy continuation is TARGET then <|im_end|>, whatever the prompt.

    Attention and MLP outputs are zeroed (o_proj, down_proj), so the last hidden state is the embedding of the
    current token; the chain tokens get orthogonal embeddings e_j and lm_head maps e_j to the next token."""
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    proc = AutoProcessor.from_pretrained(src)
    tok = proc.tokenizer
    m = Qwen2_5_VLForConditionalGeneration.from_pretrained(src)
    prompt_last = tok("\n", add_special_tokens=False).input_ids[-1]  # the generation prompt ends "assistant\n"
    chain = [prompt_last] + tok(TARGET, add_special_tokens=False).input_ids
    assert len(set(chain)) == len(chain), "chain tokens must be distinct"
    nxt = chain[1:] + [tok.convert_tokens_to_ids("<|im_end|>")]
    lm = m.model.language_model
    with torch.no_grad():
        for layer in lm.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        lm.norm.weight.fill_(1.0)
        m.lm_head.weight.zero_()
        emb = lm.embed_tokens.weight
        for j, (t, n) in enumerate(zip(chain, nxt)):
            emb[t] = 0.0
            emb[t, j] = 8.0
            m.lm_head.weight[n, j] = 1.0
    m.save_pretrained(dst)
    proc.save_pretrained(dst)
    return str(dst)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from mmgrpo.vlm.synthetic.tvg import generate
    from mmgrpo.vlm.models.tiny import save_tiny_model

    root = tmp_path_factory.mktemp("gen_vlm")
    tiny = save_tiny_model(root / "tiny", "qwen2_5_vl")
    crafted = _craft(tiny, root / "crafted")
    syn = generate(root / "syn", n_train=0, n_eval=2, seed=0)
    anns = [json.loads(line) for line in Path(syn["eval"]).read_text().splitlines() if line.strip()]
    assert len(anns) >= 3  # 2 videos, 1-3 events each
    return {"root": root, "tiny": tiny, "crafted": crafted, "ann": syn["eval"], "anns": anns}


def _run(*args):
    return generate_vlm.main(list(args) + FAST)


def _iou(p, g):
    inter = max(0.0, min(p[1], g[1]) - max(p[0], g[0]))
    union = max(p[1], g[1]) - min(p[0], g[0])
    return inter / union


def _nframes(n_video, fps_video, fps=2.0, min_frames=4, max_frames=768):
    """qwen-vl-utils frame-count rule, written out: floor2(min(max(N / f_v * fps, min), max, N))."""
    n = max(n_video / fps_video * fps, min_frames)
    n = min(n, max_frames, n_video)
    return int(n // 2 * 2)


def test_generate_then_score_tvg_by_hand(env, capsys):
    out = env["root"] / "crafted_run"
    rc = _run("--config", str(ROOT / "eval/configs/synthetic_tvg.yaml"), f"model={env['crafted']}",
              f"data.annotations={env['ann']}", f"out_dir={out}", "decoding.batch_size=2")
    assert rc == 0
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    anns = env["anns"]
    assert [p["id"] for p in preds] == [a["id"] for a in anns]  # dataset order
    assert all(p["output"] == TARGET and not p["truncated"] for p in preds)

    ious, raw = [], []  # lenient: the span clamped to the video; official (Time-R1's evaluation): as written
    for p, a in zip(preds, anns):
        d = a["duration"]
        ious.append(max(_iou([min(2.0, d), min(7.0, d)], g) for g in a["spans"]))
        raw.append(max(_iou([2.0, 7.0], g) for g in a["spans"]))
        # fps-2 contract: frame count and sampled fps from the generator's frame count / fps
        n_vid, f_v = a["meta"]["num_frames"], a["meta"]["fps"]
        assert p["num_frames"] == _nframes(n_vid, f_v)
        assert p["sample_fps"] == pytest.approx(p["num_frames"] / n_vid * f_v, abs=1e-6)
    m = json.loads((out / "metrics.json").read_text())
    assert m["n"] == len(anns) and m["n_missing"] == 0 and m["parse_failure_rate"] == 0.0
    # the synthetic benchmark's headline is Time-R1's evaluation (issue #41); the lenient parser comes second
    assert m["protocol"]["name"] == "official" and m["protocol"]["parse_mode"] == "time_r1_eval"
    assert m["mIoU"] == pytest.approx(100 * sum(raw) / len(raw))
    for t in (0.3, 0.5, 0.7):  # Time-R1 counts IoU > θ
        assert m[f"R1@{t:g}"] == pytest.approx(100 * sum(i > t for i in raw) / len(raw))
    lm = m["protocols"]["lenient"]
    assert lm["mIoU"] == pytest.approx(100 * sum(ious) / len(ious))
    for t in (0.3, 0.5, 0.7):
        assert lm[f"R1@{t:g}"] == pytest.approx(100 * sum(i >= t for i in ious) / len(ious))
    assert m["generation"]["n_truncated"] == 0
    assert m["generation"]["mean_output_tokens"] == pytest.approx(5.0)  # "2", " to", " ", "7", <|im_end|>
    # "2 to 7" has no <answer> block: read by both protocols, but not the answer the prompt asks for
    assert m["generation"]["n_well_formed"] == 0 and m["generation"]["well_formed_rate"] == 0.0

    s = json.loads((out / "settings.json").read_text())
    assert s["model"]["path"] == str(Path(env["crafted"]).resolve())
    assert s["model"]["fingerprint"]["config_sha256"] and s["model"]["fingerprint"]["digest"]
    assert any(k.endswith(".safetensors") for k in s["model"]["fingerprint"]["files"])
    assert s["video"] == {"fps": 2.0, "min_frames": 4, "max_frames": 768, "min_pixels": 3136, "max_pixels": 12544,
                          "total_pixels": 50176.0, "image_factor": 28}
    assert s["prompt"]["mode"] == "no_think" and s["prompt"]["answer_format"] == "seconds"
    assert "<answer>" in s["prompt"]["system"] and "When" in s["prompt"]["example_rendered"]
    assert s["decoding"]["greedy"] is True and s["decoding"]["max_new_tokens"] == 256  # no_think default
    assert s["model"]["dtype"] == "float32" and s["versions"]["transformers"]
    import hashlib

    assert s["data"]["sha256"] == hashlib.sha256(Path(env["ann"]).read_bytes()).hexdigest()
    assert s["data"]["n"] == len(anns)
    report = (out / "report.md").read_text()
    assert f"| mIoU | {m['mIoU']:.2f} |" in report and "## By duration_bucket" in report
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("{"):])["mIoU"] == pytest.approx(m["mIoU"])


def test_interrupted_run_resumes_to_identical_file(env):
    common = [f"model={env['tiny']}", f"data.annotations={env['ann']}", "data.prompt_mode=no_think",
              "decoding.max_new_tokens=6", "decoding.batch_size=2"]
    a, b = env["root"] / "full", env["root"] / "interrupted"
    assert _run(*common, f"out_dir={a}") == 0
    assert _run(*common, f"out_dir={b}", "max_batches=1") == 0
    pb = b / "predictions.jsonl"
    lines = pb.read_text().splitlines(keepends=True)
    assert len(lines) == 2 and not (b / "metrics.json").exists()
    # a kill in the middle of writing: the second row of the first batch is torn
    pb.write_text(lines[0] + lines[1][: len(lines[1]) // 2])
    assert _run(*common, f"out_dir={b}") == 0
    assert pb.read_bytes() == (a / "predictions.jsonl").read_bytes()
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    for m in (ma, mb):
        m.pop("config"), m["generation"].pop("last_invocation")
    assert ma == mb
    # parity with the TRAINING path: mmgrpo.vlm.config.DataConfig + TaskAdapter.prepare + HFRolloutBackend(greedy),
    # same left-padded batches of 2 -> the same texts, token counts and frame counts
    from mmgrpo.vlm.config import DataConfig
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.models.rollout import HFRolloutBackend, SamplingParams
    from mmgrpo.vlm.data.task import TaskAdapter, load_samples

    pol = load_policy(env["tiny"], dtype="float32")
    ta = TaskAdapter(pol.processor, pol.adapter, DataConfig(task="tvg", prompt_mode="no_think", video_min_pixels=3136,
                                                            video_max_pixels=12544, video_total_pixels=50176))
    backend = HFRolloutBackend(pol.model, pol.processor, pol.suppress_token_ids, max_batch_size=2)
    samples = load_samples(env["ann"])
    preps = [ta.prepare(x) for x in samples]
    out = backend.generate([p.item for p in preps], 1, SamplingParams(max_new_tokens=6, greedy=True))
    preds = [json.loads(x) for x in pb.read_text().splitlines()]
    assert [p["output"] for p in preds] == out.texts
    assert [p["n_tokens"] for p in preds] == out.lengths.tolist()
    assert [p["num_frames"] for p in preds] == [pp.clip.num_frames for pp in preps]

    # resuming with a setting that changes the number is refused, naming the setting
    with pytest.raises(Exception) as ei:
        generate_vlm.run(_cfg(*common[:-2], "decoding.max_new_tokens=7", "decoding.batch_size=2", f"out_dir={b}"))
    assert "decoding.max_new_tokens" in str(ei.value) and "overwrite" in str(ei.value)


def _cfg(*overrides):
    from mmgrpo.utils.config import load_config

    return load_config(generate_vlm.EvalVLMConfig, None, list(overrides) + FAST)


def test_adapter_folder_is_resolved_and_applied(env):
    from mmgrpo.vlm.models.adapters import LoraSpec, load_policy

    pol = load_policy(env["tiny"], lora=LoraSpec(r=4, alpha=8), dtype="float32")
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g))
    ad = env["root"] / "ckpt" / "step-00000010" / "adapter"
    pol.save_pretrained(ad)
    base, adapter = generate_vlm.resolve_model(str(ad.parent))  # a trainer checkpoint folder
    assert (base, adapter) == (env["tiny"], str(ad))
    common = [f"data.annotations={env['ann']}", "data.max_samples=1", "data.prompt_mode=no_think",
              "decoding.max_new_tokens=4"]
    res_lora = generate_vlm.run(_cfg(*common, f"model={ad}", f"out_dir={env['root'] / 'lora'}"))
    res_base = generate_vlm.run(_cfg(*common, f"model={env['tiny']}", f"out_dir={env['root'] / 'base'}"))
    s = res_lora["settings"]["model"]
    assert s["adapter"] == str(ad.resolve()) and s["merge_adapter"] and s["adapter_fingerprint"]["digest"]
    out = [json.loads((env["root"] / d / "predictions.jsonl").read_text())["output"] for d in ("lora", "base")]
    assert out[0] != out[1]
    with pytest.raises(FileNotFoundError, match="adapter_config"):
        generate_vlm.resolve_model(env["tiny"], str(env["root"]))


def test_eval_data_defaults_equal_training_defaults():
    """The video contract defaults of eval and training are the same numbers (and TaskAdapter's field names)."""
    from dataclasses import fields

    from mmgrpo.vlm.config import DataConfig

    train, ev = DataConfig(), generate_vlm.VLMDataConfig()
    shared = {f.name for f in fields(DataConfig)} & {f.name for f in fields(generate_vlm.VLMDataConfig)}
    assert {"video_fps", "min_frames", "max_frames", "video_min_pixels", "video_max_pixels", "video_total_pixels",
            "image_min_pixels", "image_max_pixels", "prompt_mode", "answer_format", "media_root", "task"} <= shared
    # on_duration_mismatch: eval warns (every sample stays scored), training skips (docs/reliability.md)
    for name in shared - {"on_missing_media", "max_samples", "on_duration_mismatch"}:
        assert getattr(ev, name) == getattr(train, name), name
    assert (train.on_duration_mismatch, ev.on_duration_mismatch) == ("skip", "warn")
    assert (ev.video_fps, ev.video_total_pixels, ev.video_min_pixels) == (2.0, 3584 * 28 * 28, 16 * 28 * 28)


def test_resumable_jsonl_rules(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "a", "output": "x"}\n{"id": "b", "output": "y"}\n{"id": "c", "out')
    w = ResumableJsonl(p).open()
    assert w.done == {"a", "b"} and w.n_truncated_bytes == len('{"id": "c", "out')
    assert p.read_text().endswith('"y"}\n')
    w.append([{"id": "c", "output": "z"}])
    assert ResumableJsonl(p).open().done == {"a", "b", "c"}
    p.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')  # damage before the last line is an error, not a resume
    with pytest.raises(ValueError, match=r"p.jsonl:2"):
        ResumableJsonl(p).open()
    p.write_text('{"id": "a"}\n{"id": "a"}\n')
    with pytest.raises(ValueError, match="duplicate"):
        ResumableJsonl(p).open()


def test_cli_errors_are_one_line(env, tmp_path, capsys):
    rc = generate_vlm.main([f"model={tmp_path / 'nope'}", f"data.annotations={env['ann']}", f"out_dir={tmp_path}"])
    assert rc == 1 and "model folder not found" in capsys.readouterr().err


def test_sampling_is_seeded_per_sample_not_per_batch(env):
    """decoding.greedy=false: row seed = hash(seed, sample index), so batch size does not change the samples."""
    common = [f"model={env['tiny']}", f"data.annotations={env['ann']}", "data.max_samples=2",
              "data.prompt_mode=no_think", "decoding.greedy=false", "decoding.max_new_tokens=5"]
    outs = {}
    for bs in (1, 2):
        res = generate_vlm.run(_cfg(*common, f"decoding.batch_size={bs}", f"out_dir={env['root'] / f'sample{bs}'}"))
        assert res["settings"]["decoding"]["temperature"] == 1.0 and res["settings"]["decoding"]["seed"] == 0
        outs[bs] = [json.loads(x)["output"] for x in (env["root"] / f"sample{bs}" / "predictions.jsonl")
                    .read_text().splitlines()]
    assert outs[1] == outs[2]


def test_rec_images_record_the_model_input_size(env, tmp_path):
    """REC: each prediction carries the processor-resized size (the frame Qwen2.5-VL writes boxes in)."""
    from PIL import Image

    rng = torch.Generator().manual_seed(0)
    anns = []
    for i, (w, h) in enumerate([(100, 80), (60, 90)]):
        px = torch.randint(0, 255, (h, w, 3), generator=rng, dtype=torch.uint8).numpy()
        Image.fromarray(px).save(tmp_path / f"img{i}.png")
        anns.append({"id": f"r{i}", "task": "rec", "image": f"img{i}.png", "query": "the red thing",
                     "boxes": [[10, 10, 50, 40]], "image_size": [w, h], "meta": {"dataset": "toy"}})
    ann = tmp_path / "rec.jsonl"
    ann.write_text("".join(json.dumps(a) + "\n" for a in anns))
    out = tmp_path / "rec_run"
    assert _run("--config", str(ROOT / "eval/configs/refcoco.yaml"), f"model={env['tiny']}", f"data.annotations={ann}",
                f"out_dir={out}", "decoding.max_new_tokens=4") == 0
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    # tiny processor: 4..16 * 28^2 pixels; smart_resize by hand: 80x100 -> 84x112 (9408 px), 90x60 -> 84x56
    assert [p["resized_image_size"] for p in preds] == [[112, 84], [56, 84]]
    m = json.loads((out / "metrics.json").read_text())
    assert m["n"] == 2 and m["config"]["box_frame"] == "qwen2_5_vl" and "Acc@0.5" in m
    assert "toy" in m["by"]["dataset"]


def test_check_resume_and_fingerprints(tmp_path):
    from eval.harness import ResumeError, check_resume, fingerprint_file, settings_fingerprint

    def settings(sha, commit):
        s = {"data": {"sha256": sha}, "code": {"commit": commit}, "run": {"created": commit}}
        s["fingerprint"] = settings_fingerprint(s)
        return s

    (tmp_path / "predictions.jsonl").write_text('{"id": "a", "output": "x"}\n')
    with pytest.raises(ResumeError, match="settings.json"):
        check_resume(tmp_path, settings("a", "c1"), "predictions.jsonl")
    (tmp_path / "settings.json").write_text(json.dumps(settings("a", "c1")))
    check_resume(tmp_path, settings("a", "c2"), "predictions.jsonl")  # another git commit: allowed (recorded)
    with pytest.raises(ResumeError, match=r"data.sha256: a -> b"):
        check_resume(tmp_path, settings("b", "c1"), "predictions.jsonl")
    # the message lists only real changes: a tuple in memory equals the list it was saved as
    s0 = {**settings("a", "c1"), "processor": {"mean": (0.5, 0.25)}}
    s0["fingerprint"] = settings_fingerprint(s0)
    (tmp_path / "settings.json").write_text(json.dumps(s0))
    s1 = {**settings("b", "c1"), "processor": {"mean": (0.5, 0.25)}}
    s1["fingerprint"] = settings_fingerprint(s1)
    with pytest.raises(ResumeError) as e:
        check_resume(tmp_path, s1, "predictions.jsonl")
    assert "data.sha256" in str(e.value) and "processor.mean" not in str(e.value)

    # weights: 'sampled' hashes size + 64 chunks of 64 KiB; 'full' every byte
    f = tmp_path / "w.safetensors"
    data = bytearray(range(256)) * (64 * 1024)  # 16 MiB
    f.write_bytes(bytes(data))
    full0, samp0 = fingerprint_file(f, "full"), fingerprint_file(f, "sampled")
    data[0] ^= 1  # inside the first sampled chunk
    f.write_bytes(bytes(data))
    assert fingerprint_file(f, "sampled") != samp0 and fingerprint_file(f, "full") != full0
    assert fingerprint_file(f, "none") == {"size": len(data)}
    small = tmp_path / "c.json"
    small.write_text("{}")
    import hashlib

    assert fingerprint_file(small, "sampled") == {"size": 2, "sha256": hashlib.sha256(b"{}").hexdigest()}


def test_missing_media_skip_is_counted_and_scored_zero(env, tmp_path):
    a = dict(env["anns"][0])
    ok = {**a, "video": str(Path(env["ann"]).parent / a["video"])}
    gone = {**a, "id": "gone", "video": str(tmp_path / "missing.mp4")}
    ann = tmp_path / "ann.jsonl"
    ann.write_text(json.dumps(ok) + "\n" + json.dumps(gone) + "\n")
    common = [f"model={env['crafted']}", f"data.annotations={ann}", "data.prompt_mode=no_think"]
    assert _run(*common, f"out_dir={tmp_path / 'err'}") == 1  # default: every missing file is an error up front
    assert _run(*common, f"out_dir={tmp_path / 'skip'}", "data.on_missing_media=skip") == 0
    preds = [json.loads(x) for x in (tmp_path / "skip" / "predictions.jsonl").read_text().splitlines()]
    assert preds[0]["output"] == TARGET and preds[1]["output"] is None and "missing.mp4" in preds[1]["error"]
    m = json.loads((tmp_path / "skip" / "metrics.json").read_text())
    d = ok["duration"]
    iou = max(_iou([min(2.0, d), min(7.0, d)], g) for g in ok["spans"])
    assert m["generation"]["n_media_error"] == 1 and m["n"] == 2
    # the skipped sample counts as IoU 0 under both protocols; lenient clamps "2 to 7" to the video, the
    # official protocol (Time-R1's evaluation) does not
    assert m["protocols"]["lenient"]["mIoU"] == pytest.approx(100 * iou / 2)
    raw = max(_iou([2.0, 7.0], g) for g in ok["spans"])
    assert m["protocol"]["name"] == "official" and m["mIoU"] == pytest.approx(100 * raw / 2)
    assert m["protocols"]["official"]["n_parse_failed"] == 1 and m["protocols"]["lenient"]["n_parse_failed"] == 1


# ------------------------------------------------------------------------------------------------ throughput changes
SHIPPED = ROOT / "data" / "checkpoints" / "tiny_vlm"


def _shipped_settings():
    """The shipped demo base's own video / prompt settings (sft_report.json), as eval overrides."""
    rep = json.loads((SHIPPED / "sft_report.json").read_text())
    v, p = rep["video"], rep["prompt"]
    return [f"data.prompt_mode={p['mode']}", f"data.answer_format={p['answer_format']}", f"data.video_fps={v['fps']}",
            f"data.max_frames={v['max_frames']}", f"data.video_min_pixels={v['min_pixels']}",
            f"data.video_max_pixels={v['max_pixels']}"]


@pytest.mark.skipif(not (SHIPPED / "model.safetensors").is_file(), reason="shipped tiny VLM not in the checkout")
def test_batched_greedy_equals_batch_size_one(env):
    """Left-padded batches of mixed prompt lengths give the predictions of one-at-a-time decoding (trained tiny
    model: outputs depend on the video, so a padding / position-id error would change them)."""
    common = ["--config", str(ROOT / "eval/configs/synthetic_tvg.yaml"), f"model={SHIPPED}",
              f"data.annotations={env['ann']}", "decoding.max_new_tokens=12", *_shipped_settings()]
    rows = {}
    for bs in (1, 4):
        out = env["root"] / f"shipped_bs{bs}"
        assert _run(*common, f"decoding.batch_size={bs}", f"out_dir={out}") == 0
        rows[bs] = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows[1]) == len(env["anns"]) >= 3
    # the batch really mixes prompt lengths (different frame counts -> different numbers of video tokens)
    assert len({r["num_frames"] for r in rows[4][:4]}) > 1
    assert [(r["output"], r["n_tokens"], r["truncated"]) for r in rows[4]] == \
           [(r["output"], r["n_tokens"], r["truncated"]) for r in rows[1]]
    assert all(r["output"] and not r["truncated"] for r in rows[1])


def test_clip_cache_gives_the_same_inputs_and_decodes_each_video_once(env):
    from mmgrpo.vlm.models.adapters import load_policy
    from mmgrpo.vlm.data.task import TaskAdapter, load_samples

    cfg = _cfg(f"model={env['tiny']}", f"data.annotations={env['ann']}", "out_dir=unused")
    pol = load_policy(env["tiny"], dtype="float32")
    samples = load_samples(env["ann"])
    plain = TaskAdapter(pol.processor, pol.adapter, cfg.data)
    cached = generate_vlm.with_clip_cache(TaskAdapter(pol.processor, pol.adapter, cfg.data), 1)
    a = [plain.prepare(s) for s in samples]
    b = [cached.prepare(s) for s in samples]
    n_videos = len({s["video"] if isinstance(s, dict) else s.video for s in samples})
    assert n_videos < len(samples)  # the fixture has several queries per video
    assert cached.clip_cache_stats == {"hits": len(samples) - n_videos, "misses": n_videos}
    for x, y in zip(a, b):
        assert x.item.keys() == y.item.keys()
        for k in x.item:
            assert torch.equal(x.item[k], y.item[k]), k
        assert x.clip.frame_indices == y.clip.frame_indices and x.clip.sample_fps == y.clip.sample_fps
    assert generate_vlm.with_clip_cache(plain, 0) is plain and not hasattr(plain, "clip_cache_stats")


def test_threads_setting_is_applied_and_not_fingerprinted(env, monkeypatch):
    common = [f"model={env['tiny']}", f"data.annotations={env['ann']}", "data.max_samples=1",
              "data.prompt_mode=no_think", "decoding.max_new_tokens=3", f"out_dir={env['root'] / 'threads'}"]
    # Record the thread count instead of really running 2 OpenMP threads in the pytest process: a 2-thread OpenMP
    # team left behind makes later fork()-based multi-process tests deadlock in the children (libgomp is not
    # fork-safe once a team exists).
    current = {"n": torch.get_num_threads()}
    monkeypatch.setattr(torch, "set_num_threads", lambda n: current.update(n=int(n)))
    monkeypatch.setattr(generate_vlm, "_torch_threads", lambda: current["n"])
    r1 = generate_vlm.run(_cfg(*common, "threads=2", "max_batches=1"))
    assert current["n"] == 2 and r1["settings"]["run"]["torch_threads"] == 2
    r2 = generate_vlm.run(_cfg(*common, "threads=1"))  # resumes: same fingerprint
    assert current["n"] == 1 and r2["settings"]["run"]["torch_threads"] == 1
    assert r1["settings"]["fingerprint"] == r2["settings"]["fingerprint"]
    assert r2["stats"]["n_already_done"] == 1 and r2["metrics"]["n"] == 1
    with pytest.raises(ValueError, match="threads"):
        generate_vlm.run(_cfg(*common, "threads=-1"))


def test_checkpoint_generation_config_is_ignored_and_recorded(env):
    """A checkpoint carrying the released Qwen2.5-VL Instruct decoding fields (plus min_new_tokens, which would
    forbid the crafted model's early <|im_end|>) still decodes the plain argmax; the ignored fields are written
    next to the metrics (issue #23 item 10)."""
    import shutil

    model = env["root"] / "crafted_released_gc"
    shutil.copytree(env["crafted"], model)
    p = model / "generation_config.json"
    gc = json.loads(p.read_text())
    gc.update({"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.1, "top_p": 0.001, "top_k": 1,
               "min_new_tokens": 8})
    p.write_text(json.dumps(gc))
    out = env["root"] / "released_gc_run"
    with pytest.warns(UserWarning, match="repetition_penalty"):
        rc = _run("--config", str(ROOT / "eval/configs/synthetic_tvg.yaml"), f"model={model}",
                  f"data.annotations={env['ann']}", f"out_dir={out}", "decoding.max_new_tokens=10")
    assert rc == 0
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(r["output"] == TARGET and r["n_tokens"] == 5 for r in preds)
    m = json.loads((out / "metrics.json").read_text())
    assert m["decoding"]["checkpoint_generation_config"] == "ignored"
    assert m["decoding"]["checkpoint_fields_ignored"] == {"do_sample": True, "repetition_penalty": 1.05,
                                                          "temperature": 0.1, "top_p": 0.001, "top_k": 1,
                                                          "min_new_tokens": 8}


def test_export_files_are_written_after_scoring(env, tmp_path, capsys):
    out = tmp_path / "exp_run"
    rc = _run("--config", str(ROOT / "eval/configs/synthetic_tvg.yaml"), f"model={env['crafted']}",
              f"data.annotations={env['ann']}", f"out_dir={out}", "decoding.batch_size=4",
              "score.protocol=official", "export=[lmms_eval_tvg,time_r1_tvg]")
    assert rc == 0
    anns = env["anns"]
    sub = json.loads((out / "export" / "lmms_eval_tvg_submission.json").read_text())
    assert sub == {f"{Path(a['video']).name}>>>{a['query']}>>>{[float(x) for x in a['spans'][0]]}": TARGET
                   for a in anns}
    rows = [json.loads(x) for x in (out / "export" / "time_r1_predictions.jsonl").read_text().splitlines()]
    assert [r["qid"] for r in rows] == [a["id"] for a in anns]
    assert all(r["pred"] == [2.0, 7.0] and r["output_text"] == TARGET for r in rows)  # Time-R1 eval: no clamp
    assert [r["target"] for r in rows] == [[float(x) for x in a["spans"][0]] for a in anns]
    m = json.loads((out / "metrics.json").read_text())
    assert [e["format"] for e in m["export"]] == ["lmms_eval_tvg", "time_r1_tvg"]
    # a format of another task fails before any generation
    bad = tmp_path / "bad_run"
    assert _run("--config", str(ROOT / "eval/configs/synthetic_tvg.yaml"), f"model={env['crafted']}",
                f"data.annotations={env['ann']}", f"out_dir={bad}", "export=[nextgqa]") == 1
    assert "is for task 'gqa', not 'tvg'" in capsys.readouterr().err
    assert not (bad / "predictions.jsonl").exists()


def test_vsibench_config_runs_a_mixed_letters_and_numbers_file(env, tmp_path):
    """eval/configs/vsibench.yaml on a VSI-Bench-shaped file (multiple choice + numerical qa samples in one file):
    the crafted model answers "2 to 7" everywhere; the release reads its first word "2"."""
    video = str(Path(env["ann"]).parent / env["anns"][0]["video"])
    rows = [{"id": "m1", "task": "mcq", "query": "Is the lamp to my left or right?", "video": video,
             "options": ["left", "right"], "answer": "A", "meta": {"question_type": "object_rel_distance"}},
            {"id": "n1", "task": "qa", "query": "How many chairs?", "video": video, "answer": "2",
             "meta": {"problem_type": "numerical", "question_type": "object_counting"}},
            {"id": "n2", "task": "qa", "query": "How far apart (m)?", "video": video, "answer": "2.5",
             "meta": {"problem_type": "numerical", "question_type": "object_abs_distance"}}]
    ann = tmp_path / "vsi.jsonl"
    ann.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    rc = _run("--config", str(ROOT / "eval/configs/vsibench.yaml"), f"model={env['crafted']}",
              f"data.annotations={ann}", f"out_dir={out}", "data.min_frames=4",
              "data.max_frames=4")
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    b = m["benchmark"]
    assert b["name"] == "vsibench" and b["n"] == 3
    assert b["object_counting_MRA:.5:.95:.05"] == 100.0  # "2" vs 2
    # |2 - 2.5| / 2.5 = 0.2: θ = 0.50 .. 0.75 (at 0.8, 1 - 0.8 < 0.2 in floating point, as the release computes)
    assert b["object_abs_distance_MRA:.5:.95:.05"] == pytest.approx(60.0)
    assert b["object_rel_distance_accuracy"] == 0.0 and b["overall"] is None  # 3 of the 8 types
    assert m["n"] == 3 and m["n_numeric"] == 2
