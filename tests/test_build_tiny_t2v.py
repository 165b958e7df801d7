"""scripts/build_tiny_t2v.py: the identity Wan VAE reconstructs, the direction-noise rule is the documented one
(counted by hand), and a seconds-budget build saves a folder that loads through the Wan adapter."""
import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

ROOT = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location("build_tiny_t2v", ROOT / "scripts" / "build_tiny_t2v.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_identity_vae_reconstructs_a_clip():
    from mmgrpo.synthetic.t2v import all_prompts, render_clip

    b = _builder()
    clip = render_clip(all_prompts("train", tags=["two_motion"])[0], 32, 5, seed=0)
    assert b.vae_roundtrip_error(b.identity_wan_vae(), clip) < 0.5  # uint8 levels
    # latents shortcut == the VAE's own encoder (normalised by latents_mean / std)
    pipe_like = type("P", (), {"vae": b.identity_wan_vae()})()
    x = torch.from_numpy(clip).permute(3, 0, 1, 2)[None].float() / 127.5 - 1.0
    with torch.no_grad():
        z = pipe_like.vae.encode(x).latent_dist.mode()
    assert torch.allclose(b.clip_latents(pipe_like, clip[None]), (z - 0.0) / 0.5, atol=1e-3)


def test_direction_noise_rule_by_hand():
    b = _builder()
    mover = {"prompt": "a red circle moves up", "objects": [
        {"color": "red", "shape": "circle", "count": 1, "direction": "up", "order": 0}]}
    still = {"prompt": "a blue square appears, then a green triangle", "objects": [
        {"color": "blue", "shape": "square", "count": 1, "direction": "none", "order": 0},
        {"color": "green", "shape": "triangle", "count": 1, "direction": "none", "order": 1}]}
    # p = 1: a mover always changes, to rng.choice of the other three in DIRECTIONS order (left, right, down)
    rng, ref = random.Random(5), random.Random(5)
    out, noised = b.noisy_spec(mover, rng, 1.0)
    ref.random()
    assert noised and out["objects"][0]["direction"] == ref.choice(["left", "right", "down"])
    assert mover["objects"][0]["direction"] == "up"  # input untouched
    # a spec without mover draws nothing from the rng and is unchanged
    rng = random.Random(7)
    state = rng.getstate()
    assert b.noisy_spec(still, rng, 1.0) == (still, False) and rng.getstate() == state
    # p = 0.3 on 8 movers, seed 0: the hand count of draws below 0.3
    rng, flags = random.Random(0), []
    r2 = random.Random(0)
    hand = 0
    for _ in range(8):
        u = r2.random()
        if u < 0.3:
            hand += 1
            r2.choice([0, 1, 2])  # the replacement draw consumes the rng too
        flags.append(b.noisy_spec(mover, rng, 0.3)[1])
    assert sum(flags) == hand


def test_build_tiny_budget_loads_through_adapter(tmp_path):
    b = _builder()
    out = tmp_path / "t2v"
    rc = b.main(["--out", str(out), "--seconds", "1", "--steps", "2", "--batch-size", "2", "--frames", "5",
                 "--width", "16", "--heads", "2", "--layers", "1", "--direction-noise", "0.5"])
    assert rc == 0
    info = json.loads((out / "build_info.json").read_text())
    assert 1 <= info["train_steps"] <= 2 and info["clips_drawn"] == 2 * info["train_steps"]
    assert info["vae_reconstruction"]["identity_vae_max_err_uint8"] < 0.5
    from flow_grpo.models import load_adapter

    ad = load_adapter(str(out), max_sequence_length=b.DEMO_MAX_SEQUENCE_LENGTH, num_frames=5)
    assert ad.kind == "wan" and ad.noise_shape(32, 32) == (3, 5, 32, 32)
    vid = b.generate(ad, ["a red circle moves up"], [0], steps=2, size=32)
    assert vid.shape == (1, 5, 32, 32, 3) and vid.dtype == np.uint8


def test_render_aligned_cells_motion_and_verifier():
    """--layout aligned: each shape fills exactly one 8 px cell on every frame, a mover steps 0, 0, 1, 1, 2 cells
    its way over 5 frames (floor(k * 2 / 4)), and the verifier accepts every clip of the motion / two_motion tags."""
    from flow_grpo.rewards.motion import verify_clip
    from mmgrpo.synthetic.t2v import BACKGROUND, all_prompts

    b = _builder()
    bg = np.array(BACKGROUND, np.uint8)
    for d, (ax, sign) in {"left": (0, -1), "right": (0, 1), "up": (1, -1), "down": (1, 1)}.items():
        spec = {"prompt": f"a red square moves {d}", "objects": [
            {"color": "red", "shape": "square", "count": 1, "direction": d, "order": 0}]}
        for seed in range(4):
            clip = b.render_aligned(spec, 32, 5, 8, 2, seed)
            cells = []
            for fr in clip:
                fg = np.argwhere((fr != bg).any(-1))  # (row, col) of the square's 64 pixels
                assert len(fg) == 64 and (fg.min(0) % 8 == 0).all() and (fg.max(0) - fg.min(0) == 7).all()
                cells.append((fg.min(0)[1] // 8, fg.min(0)[0] // 8))  # (col, row)
            along = [c[ax] - cells[0][ax] for c in cells]
            assert along == [0, 0, sign, sign, 2 * sign]
            assert len({c[1 - ax] for c in cells}) == 1
    for split in ("train", "heldout"):
        for m in all_prompts(split, tags=["motion", "two_motion"])[:40]:
            assert verify_clip(b.render_aligned(m, 32, 5, 8, 2, 3), m)["strict"]
    with pytest.raises(ValueError, match="count-1"):
        b.render_aligned(all_prompts("train", tags=["count_motion"])[0], 32, 5)
    assert b.drawn_direction([3.0, -1.0]) == "right" and b.drawn_direction([0.5, -4.0]) == "up"
    assert b.drawn_direction(None) == "none"


def test_word_tokens_vocabulary():
    """--word-tokens: every Mini-T2V prompt word is one token (no <unk>, the longest prompt fits the 32-token text
    length); without it the shared tiny vocabulary is unchanged and spells "triangle" letter by letter."""
    from flow_grpo.models.tiny_tokenizers import build_t5_unigram_tokenizer
    from mmgrpo.synthetic.t2v import all_prompts

    b = _builder()
    tok = b.build_pipeline(0, 16, 2, 1, 8, word_tokens=True).tokenizer
    for split in ("train", "val", "heldout"):
        for m in all_prompts(split):
            ids = tok(m["prompt"]).input_ids
            assert len(ids) == len(m["prompt"].split()) + 1 <= b.DEMO_MAX_SEQUENCE_LENGTH  # words + </s>
            assert tok.unk_token_id not in ids
    shared = build_t5_unigram_tokenizer()
    assert len(shared) == 85 and len(shared("triangle").input_ids) > 2
    long = shared("a blue triangle moves from right to left").input_ids
    assert len(long) > b.DEMO_MAX_SEQUENCE_LENGTH  # why the option exists


def test_render_aligned_fixed_paths():
    """--paths fixed: one path per direction, from the edge the mover leaves along FIXED_ACROSS's row / column,
    0, 0, 1, 2, 3 cells at --move-cells 3; the seed changes nothing; the verifier accepts every motion prompt;
    multi-entry specs are refused."""
    from flow_grpo.rewards.motion import verify_clip
    from mmgrpo.synthetic.t2v import BACKGROUND, all_prompts

    b = _builder()
    bg = np.array(BACKGROUND, np.uint8)
    want = {"right": [(0, 1), (0, 1), (1, 1), (2, 1), (3, 1)], "left": [(3, 2), (3, 2), (2, 2), (1, 2), (0, 2)],
            "down": [(1, 0), (1, 0), (1, 1), (1, 2), (1, 3)], "up": [(2, 3), (2, 3), (2, 2), (2, 1), (2, 0)]}
    for d, cells in want.items():  # (col, row) per frame, written out by hand
        spec = {"prompt": f"a red square moves {d}", "objects": [
            {"color": "red", "shape": "square", "count": 1, "direction": d, "order": 0}]}
        for seed in (0, 9):
            clip = b.render_aligned(spec, 32, 5, 8, 3, seed, paths="fixed")
            got = [tuple(int(v) for v in np.argwhere((fr != bg).any(-1)).min(0)[::-1] // 8) for fr in clip]
            assert got == cells
    for split in ("train", "val", "heldout"):
        for m in all_prompts(split, tags=["motion"]):
            assert verify_clip(b.render_aligned(m, 32, 5, 8, 3, 0, paths="fixed"), m)["strict"]
    with pytest.raises(ValueError, match="single-entry"):
        b.render_aligned(all_prompts("train", tags=["two_motion"])[0], 32, 5, 8, 2, 0, paths="fixed")
    with pytest.raises(ValueError, match="paths"):
        b.render_aligned(all_prompts("train", tags=["motion"])[0], 32, 5, paths="diagonal")


def test_abs_pos_fixed_paths_build_loads(tmp_path):
    b = _builder()
    out = tmp_path / "t2v"
    rc = b.main(["--out", str(out), "--seconds", "1", "--steps", "1", "--batch-size", "2", "--frames", "5",
                 "--width", "16", "--heads", "2", "--layers", "1", "--patch", "8", "--layout", "aligned",
                 "--tags", "motion", "--paths", "fixed", "--move-cells", "3", "--abs-pos", "--direction-noise", "0.3"])
    assert rc == 0
    demo = json.loads((out / "mmgrpo_demo.json").read_text())
    assert (demo["paths"], demo["abs_pos"], demo["move_cells"]) == ("fixed", True, 3)
    from flow_grpo.models import load_adapter

    ad = load_adapter(str(out), max_sequence_length=b.DEMO_MAX_SEQUENCE_LENGTH, num_frames=5)
    assert type(ad.transformer).__name__ == "WanAbsPosTransformer3DModel"
    with pytest.raises(ValueError, match="--paths fixed needs"):
        b.main(["--out", str(tmp_path / "x"), "--paths", "fixed", "--tags", "motion"])


def test_stall_noise_rule():
    """--stall-noise: a stalled mover stays in its path's start cell on every frame (verifier: direction fails,
    every other check passes); one extra rng draw per mover clip only when the option is on, so stall_noise = 0
    gives the old batches bit for bit; the builder refuses it outside --layout aligned."""
    from flow_grpo.rewards.motion import verify_clip
    from mmgrpo.synthetic.t2v import BACKGROUND, all_prompts

    b = _builder()
    bg = np.array(BACKGROUND, np.uint8)
    for m in all_prompts("train", tags=["motion"]):
        moving = b.render_aligned(m, 32, 5, 8, 3, 0, paths="fixed")
        still = b.render_aligned(m, 32, 5, 8, 3, 0, paths="fixed", stall=True)
        assert all((fr == moving[0]).all() for fr in still)  # the start frame, repeated
        res = verify_clip(still, m)
        assert [c["check"] for c in res["checks"] if not c["ok"]] == ["direction"]
    # random start cells: same start cell as the moving clip of the same seed
    m = all_prompts("train", tags=["motion"])[0]
    for seed in (1, 2, 3):
        first = b.render_aligned(m, 32, 5, 8, 2, seed)[0]
        assert (b.render_aligned(m, 32, 5, 8, 2, seed, stall=True) == first).all()
        assert (first != bg).any()
    # stall_noise = 0 keeps the RNG stream (and the clips) of a build without the option
    new = b.ClipBatches(8, 32, 5, 0, 0.3, ["motion"], "aligned", 8, 3, "fixed", 0.0)
    old = b.ClipBatches(8, 32, 5, 0, 0.3, ["motion"], "aligned", 8, 3, "fixed")
    for step in range(3):
        (x, p), (y, q) = new(step), old(step)
        assert (x == y).all() and p == q
    assert new.stalled == 0
    # p = 1: every clip is still; p = 0.5 over 40 x 16 clips: about half
    allst = b.ClipBatches(4, 32, 5, 0, 0.0, ["motion"], "aligned", 8, 3, "fixed", 1.0)
    clips, _ = allst(0)
    assert allst.stalled == 4 and all((c == c[0]).all() for c in clips)
    half = b.ClipBatches(16, 32, 5, 0, 0.0, ["motion"], "aligned", 8, 3, "fixed", 0.5)
    for step in range(40):
        half(step)
    assert 0.4 < half.stalled / half.drawn < 0.6
    with pytest.raises(ValueError, match="aligned"):
        b.ClipBatches(4, 32, 5, 0, 0.0, ["motion"], "free", stall_noise=0.5)
    with pytest.raises(ValueError, match="--stall-noise"):
        b.main(["--out", "/nonexistent/x", "--stall-noise", "0.5"])


def test_ghost_noise_rule():
    """--ghost-noise: a still distractor of another colour sits in GHOST_CELL on every frame on top of the
    unchanged clip (verifier: only ``extra`` fails, for every train / held-out prompt, colour and shape); its draws
    happen only when the option is on (ghost_noise = 0 gives the old batches); the rate is about p; refused
    without fixed paths or with the spec's own colour."""
    from flow_grpo.rewards.motion import verify_clip
    from mmgrpo.synthetic.t2v import BACKGROUND, COLORS, SHAPES, all_prompts

    b = _builder()
    bg = np.array(BACKGROUND, np.uint8)
    cx, cy = b.GHOST_CELL
    for m in all_prompts("train", tags=["motion"]) + all_prompts("heldout", tags=["motion"]):
        clean = b.render_aligned(m, 32, 5, 8, 3, 0, paths="fixed")
        for c in COLORS:
            if c == m["objects"][0]["color"]:
                continue
            for sh in SHAPES:
                g = b.render_aligned(m, 32, 5, 8, 3, 0, paths="fixed", ghost=(c, sh))
                cell = g[:, cy * 8:(cy + 1) * 8, cx * 8:(cx + 1) * 8]
                assert (cell == cell[0]).all() and (cell[0] == np.array(COLORS[c], np.uint8)).all(-1).any()
                assert (clean[:, cy * 8:(cy + 1) * 8, cx * 8:(cx + 1) * 8] == bg).all()  # off every path
                outside = np.ones((32, 32), bool)
                outside[cy * 8:(cy + 1) * 8, cx * 8:(cx + 1) * 8] = False
                assert (g[:, outside] == clean[:, outside]).all()
                res = verify_clip(g, m)
                assert [k["check"] for k in res["checks"] if not k["ok"]] == ["extra"], (m["prompt"], c, sh)
    m = all_prompts("train", tags=["motion"])[0]
    with pytest.raises(ValueError, match="ghost"):
        b.render_aligned(m, 32, 5, 8, 3, 0, paths="fixed", ghost=(m["objects"][0]["color"], "square"))
    with pytest.raises(ValueError, match="ghost"):
        b.render_aligned(m, 32, 5, 8, 2, 0, ghost=("blue", "square"))
    new = b.ClipBatches(8, 32, 5, 0, 0.3, ["motion"], "aligned", 8, 3, "fixed", 0.0, 0.0)
    old = b.ClipBatches(8, 32, 5, 0, 0.3, ["motion"], "aligned", 8, 3, "fixed")
    for step in range(3):
        (x, p), (y, q) = new(step), old(step)
        assert (x == y).all() and p == q
    assert new.ghosted == 0
    half = b.ClipBatches(16, 32, 5, 0, 0.0, ["motion"], "aligned", 8, 3, "fixed", 0.0, 0.6)
    n_corner = 0
    for step in range(40):
        clips, prompts = half(step)
        n_corner += int((clips[:, 0, cy * 8:(cy + 1) * 8, cx * 8:(cx + 1) * 8] != bg).any(axis=(1, 2, 3)).sum())
    assert n_corner == half.ghosted and 0.5 < half.ghosted / half.drawn < 0.7
    with pytest.raises(ValueError, match="ghost_noise"):
        b.ClipBatches(4, 32, 5, 0, 0.0, ["motion"], "aligned", 8, 3, "random", 0.0, 0.5)
    with pytest.raises(ValueError, match="--ghost-noise"):
        b.main(["--out", "/nonexistent/x", "--ghost-noise", "0.5"])


def test_demo_recipe_is_the_shipped_build():
    """``--demo`` reproduces the shipped base's recorded arguments (data/checkpoints/tiny_t2v/build_info.json), so
    the recipe cannot drift from the folder; explicit options still override it."""
    b = _builder()
    shipped = json.loads((ROOT / "data" / "checkpoints" / "tiny_t2v" / "build_info.json").read_text())["args"]
    args = vars(b.parse_args(["--demo", "--out", shipped["out"]]))
    assert args.pop("demo") and shipped.pop("demo", True)
    assert args == shipped
    assert b.parse_args(["--demo", "--steps", "7"]).steps == 7 and b.parse_args([]).width == 96


@pytest.mark.extended  # slow script/benchmark check: bash scripts/test.sh --full
def test_text_encoder_warm_up_learns_word_order():
    """--text-pretrain-steps: the random tiny UMT5 maps "from left to right" and "from right to left" to the same
    bag of token outputs (their masked means differ by < 3 % of a token's norm); after the warm-up they differ
    5x more, the probe reads every train and val prompt's direction, the encoder itself was
    trained although the adapter had frozen it, and its requires_grad flags are restored."""
    from flow_grpo.models import adapter_from_pipeline

    b = _builder()
    pipe = b.build_pipeline(0, 16, 2, 1, 8, word_tokens=True)
    adapter_from_pipeline(pipe, max_sequence_length=12, num_frames=5)  # as in the builder: it freezes the encoder
    te = pipe.text_encoder
    prompts = ["a red circle moves from left to right", "a red circle moves from right to left",
               "a red circle moves up", "a red circle moves down"]

    def means():  # what Wan's pipeline feeds the transformer: the token outputs, zeroed after the prompt's tokens
        tok = pipe.tokenizer(prompts, padding="max_length", max_length=12, truncation=True, return_tensors="pt")
        with torch.no_grad():
            e = te(tok.input_ids, tok.attention_mask).last_hidden_state * tok.attention_mask[..., None]
        return e.sum(1) / tok.attention_mask.sum(1, keepdim=True), e[0, :8].norm(dim=-1).mean()

    m, norm = means()
    lr_before = (m[0] - m[1]).norm()
    assert lr_before < 0.03 * norm  # bag of words before
    flags = [q.requires_grad for q in te.parameters()]
    before = [q.detach().clone() for q in te.parameters()]
    res = b.pretrain_text_encoder(pipe, 1500, 12)
    assert [q.requires_grad for q in te.parameters()] == flags
    assert any(not torch.equal(q, p0) for q, p0 in zip(te.parameters(), before))
    assert res["accuracy"]["train"]["direction"] == 1.0 and res["accuracy"]["val"]["direction"] == 1.0
    m, norm = means()
    print("L2R vs R2L mean outputs, before / after:", float(lr_before), float((m[0] - m[1]).norm()))
    assert (m[0] - m[1]).norm() > 5 * lr_before
