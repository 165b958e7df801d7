"""Mini-GenEval: prompt grammar and splits, the programmatic verifier, and the reference renderer.

The verifier is tested on images drawn here with an independent PIL routine (4x supersampled anti-aliasing,
off-palette colours, off-white background, optional JPEG), not with ``render``.
"""
import io
import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from flow_grpo.rewards.mini_geneval import load_synthetic_t2i

S = load_synthetic_t2i()

# Colours near, but not equal to, the palette (a generator never hits the exact RGB values).
RED, GREEN, BLUE, YELLOW = (205, 50, 50), (50, 160, 70), (50, 90, 210), (240, 210, 40)


def draw(objs, size=64, bg=(250, 250, 250), jpeg=None, ss=4):
    """objs: (shape, rgb, (cx, cy), r) in pixel units of the final image."""
    im = Image.new("RGB", (size * ss, size * ss), bg)
    d = ImageDraw.Draw(im)
    for shape, rgb, (cx, cy), r in objs:
        cx, cy, r = cx * ss, cy * ss, r * ss
        if shape == "circle":
            d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=rgb)
        elif shape == "square":
            d.rectangle([cx - 0.9 * r, cy - 0.9 * r, cx + 0.9 * r, cy + 0.9 * r], fill=rgb)
        elif shape == "triangle":
            d.polygon([(cx - r, cy + 0.85 * r), (cx + r, cy + 0.85 * r), (cx, cy - r)], fill=rgb)
        elif shape == "triangle_down":
            d.polygon([(cx - r, cy - 0.85 * r), (cx + r, cy - 0.85 * r), (cx, cy + r)], fill=rgb)
        elif shape == "diamond":
            d.polygon([(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)], fill=rgb)
        elif shape == "bar":
            d.rectangle([cx - r, cy - 0.25 * r, cx + r, cy + 0.25 * r], fill=rgb)
    im = im.resize((size, size), Image.LANCZOS)
    if jpeg:
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=jpeg)
        im = Image.open(buf).convert("RGB")
    return np.asarray(im).copy()


def meta(prompt):
    m = S.parse_prompt(prompt)
    assert m is not None, prompt
    return m


# ------------------------------------------------------------------------------------------ prompts and splits
def _content_key(m):
    """Independent canonical content of a prompt's metadata (order-free; "A left of B" == "B right of A")."""
    inc = m["include"]
    objs = [(e["class"], e.get("color"), e["count"]) for e in inc]
    rel = [(i, e["position"]) for i, e in enumerate(inc) if "position" in e]
    if not rel:
        return (m["tag"], tuple(sorted(objs, key=str)))
    (i, (r, j)), = rel
    a, b = objs[i], objs[j]
    inv = {"right of": "left of", "below": "above"}
    if r in inv:
        a, b, r = b, a, inv[r]
    return (m["tag"], a, r, b)


def test_splits_are_disjoint_in_content_and_cover_every_tag():
    train, held = S.all_prompts("train"), S.all_prompts("heldout")
    k_train, k_held = {_content_key(m) for m in train}, {_content_key(m) for m in held}
    assert not (k_train & k_held)
    for tag in S.TAGS:
        assert any(m["tag"] == tag for m in train) and any(m["tag"] == tag for m in held), tag
    n_total = len(k_train) + len(k_held)
    assert 0.15 < len(k_held) / n_total < 0.3
    # sampled prompts stay in their split
    assert {_content_key(m) for m in S.make_prompts(300, seed=1, split="heldout")} <= k_held


def test_make_prompts_is_deterministic_and_balanced_over_tags():
    a, b = S.make_prompts(200, seed=3), S.make_prompts(200, seed=3)
    assert a == b
    assert a != S.make_prompts(200, seed=4)
    counts = {t: sum(m["tag"] == t for m in a) for t in S.TAGS}
    assert all(20 <= c <= 60 for c in counts.values()), counts  # uniform over 5 tags: 40 expected
    only = S.make_prompts(20, seed=0, tags=["counting"])
    assert {m["tag"] for m in only} == {"counting"}
    with pytest.raises(ValueError, match="split"):
        S.make_prompts(1, split="validation")


def test_prompt_text_agrees_with_geneval_metadata():
    num = {1: "a", 2: "two", 3: "three", 4: "four"}
    for m in S.all_prompts("train") + S.all_prompts("heldout"):
        p = m["prompt"]
        assert m["tag"] in S.TAGS and isinstance(m["include"], list)
        for e in m["include"]:
            word = e["class"] + ("s" if e["count"] > 1 else "")
            phrase = " ".join([num[e["count"]]] + ([e["color"]] if "color" in e else []) + [word])
            assert phrase in p, (phrase, p)
        if m["tag"] == "position":
            ref, obj = m["include"]
            rel = obj["position"][0]
            assert obj["position"][1] == 0
            assert p.index(obj["class"]) < p.index(ref["class"])  # "<obj> <rel> <ref>"
            assert rel in p  # "on the left of" / "on the right of" / "above" / "below"
        assert S.parse_prompt(p) == m
    assert S.parse_prompt("a purple hexagon") is None


# ------------------------------------------------------------------------------------------ verifier: correct
@pytest.mark.parametrize("jpeg", [None, 85])
@pytest.mark.parametrize("prompt,objs", [
    ("a circle", [("circle", YELLOW, (30, 34), 9)]),
    ("a red circle", [("circle", RED, (20, 40), 8)]),
    ("two red circles", [("circle", RED, (16, 20), 8), ("circle", RED, (44, 40), 9)]),
    ("three yellow triangles", [("triangle", YELLOW, (14, 14), 7), ("triangle", YELLOW, (46, 18), 7),
                                ("triangle", YELLOW, (30, 48), 8)]),
    ("four blue squares", [("square", BLUE, (14, 14), 7), ("square", BLUE, (48, 14), 7),
                           ("square", BLUE, (14, 48), 7), ("square", BLUE, (48, 48), 7)]),
    ("a red circle and a blue square", [("square", BLUE, (48, 18), 8), ("circle", RED, (18, 44), 8)]),
    ("a blue square on the left of a green triangle", [("square", BLUE, (16, 30), 8),
                                                      ("triangle", GREEN, (46, 34), 9)]),
    ("a green triangle below a yellow circle", [("triangle_down", GREEN, (36, 48), 8),
                                                ("circle", YELLOW, (28, 16), 8)]),
])
def test_verify_accepts_hand_drawn_correct_images(prompt, objs, jpeg):
    res = S.verify(draw(objs, jpeg=jpeg), meta(prompt))
    assert res["correct"], res["details"]
    assert res["score"] == 1.0
    json.dumps(res)  # details are JSON-serialisable for logging


def test_verify_at_32px():
    # ~10 px anti-aliased objects: the smallest size the docstring promises for anti-aliased input
    img = draw([("circle", RED, (9, 10), 5), ("square", RED, (23, 22), 5)], size=32)
    # one circle of two: g = 0.5 for both counts -> c = 0.5; the square is an extra -> 0.5 / 2
    assert S.verify(img, meta("two red circles"))["score"] == pytest.approx(0.25)
    assert S.verify(draw([("circle", RED, (9, 10), 5), ("circle", RED, (23, 22), 5.3)], size=32),
                    meta("two red circles"))["correct"]


# ------------------------------------------------------------------------------------------ verifier: incorrect
# Expected partial scores by hand: score = mean(c_e, c_p) / (1 + extras), c_e = (g(m_e) + g(n_e)) / 2,
# g(n) = max(0, 1 - |n - k| / k).
@pytest.mark.parametrize("prompt,objs,score,why", [
    # wrong colour: m=1 -> g=1, n=0 -> g=0: c=0.5; the blue circle matches no entry -> extras=1 -> 0.25
    ("a red circle", [("circle", BLUE, (30, 30), 9)], 0.25, "colour"),
    # wrong count: n=m=3 for k=2 -> g=0.5, c=0.5; all three match the entry -> no extras
    ("two red circles", [("circle", RED, (14, 14), 7), ("circle", RED, (46, 16), 7), ("circle", RED, (30, 46), 7)],
     0.5, "count"),
    ("three yellow triangles", [("triangle", YELLOW, (16, 20), 8), ("triangle", YELLOW, (44, 40), 8)],
     1 - 1 / 3, "count"),
    # wrong shape: nothing matches (c=0), one extra
    ("a red circle", [("square", RED, (30, 30), 9)], 0.0, "shape"),
    ("a green triangle", [("diamond", GREEN, (30, 30), 11)], 0.0, "shape"),  # symmetric: not a triangle
    ("a blue square", [("bar", BLUE, (30, 30), 12)], 0.0, "shape"),  # elongated: not a square
    # wrong position: both counts right (1, 1), relation fails (0) -> 2/3
    ("a blue square on the left of a green triangle", [("square", BLUE, (46, 30), 8),
                                                      ("triangle", GREEN, (16, 34), 9)], 2 / 3, "position"),
    ("a red circle above a yellow square", [("circle", RED, (30, 48), 8), ("square", YELLOW, (30, 14), 8)],
     2 / 3, "position"),
    # an extra object: c=1, extras=1 -> 0.5
    ("a red circle", [("circle", RED, (16, 16), 8), ("square", GREEN, (44, 44), 8)], 0.5, "extra"),
    # attribute binding swapped: circle blue, square red -> each entry c=0.5, 2 extras -> 0.5 / 3
    ("a red circle and a blue square", [("circle", BLUE, (16, 16), 8), ("square", RED, (44, 44), 8)], 0.5 / 3,
     "binding"),
    ("a circle", [], 0.0, "blank"),
])
def test_verify_rejects_wrong_images_with_hand_computed_partial_score(prompt, objs, score, why):
    res = S.verify(draw(objs), meta(prompt))
    assert not res["correct"], why
    assert res["score"] == pytest.approx(score, abs=1e-9), (why, res["details"])


def test_verify_ignores_specks_and_validates_metadata():
    img = draw([("circle", RED, (30, 30), 9)])
    img[2:4, 2:4] = (40, 80, 220)  # a 4-pixel blue speck: noise, not an object
    res = S.verify(img, meta("a red circle"))
    assert res["correct"] and res["details"]["noise_components"] == 1
    with pytest.raises(ValueError, match=r"include\[0\].class"):
        S.verify(img, {"include": [{"class": "hexagon", "count": 1}]})
    with pytest.raises(ValueError, match=r"include\[1\].position"):
        S.verify(img, {"include": [{"class": "circle", "count": 1},
                                   {"class": "square", "count": 1, "position": ["near", 0]}]})
    with pytest.raises(ValueError, match="uint8"):
        S.verify(img.astype(np.float32), meta("a red circle"))


# ------------------------------------------------------------------------------------------ connected components
def _reference_components(mask):
    """Union-find over 8-neighbours (independent of the BFS under test)."""
    h, w = mask.shape
    parent = {}

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for y in range(h):
        for x in range(w):
            if mask[y, x]:
                parent[(y, x)] = (y, x)
    for (y, x) in list(parent):
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):
                q = (y + dy, x + dx)
                if q in parent:
                    parent[find((y, x))] = find(q)
    return {p: find(p) for p in parent}


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.floats(0.1, 0.7), st.integers(0, 10_000))
def test_bfs_labeller_matches_union_find(h, w, p, seed):
    rng = np.random.default_rng(seed)
    mask = rng.random((h, w)) < p
    saved = sys.modules.get("scipy", "absent")
    sys.modules["scipy"] = None  # force the pure-python BFS path even where scipy is installed
    try:
        labels, n = S.connected_components(mask)
    finally:
        if saved == "absent":
            del sys.modules["scipy"]
        else:
            sys.modules["scipy"] = saved
    ref = _reference_components(mask)
    assert n == len(set(ref.values()))
    assert ((labels > 0) == mask).all()
    # same partition: two pixels share a BFS label iff they share a union-find root
    pix = list(ref)
    for a in pix:
        for b in pix:
            assert (labels[a] == labels[b]) == (ref[a] == ref[b])


# ------------------------------------------------------------------------------------------ renderer
@settings(max_examples=120, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["train", "heldout"]), st.sampled_from([32, 48, 64]))
def test_render_always_verifies_correct(seed, split, size):
    m = S.make_prompts(1, seed=seed, split=split)[0]
    img = S.render(m, size=size, seed=seed)
    assert img.shape == (size, size, 3) and img.dtype == np.uint8
    res = S.verify(img, m)
    assert res["correct"], (m["prompt"], res["details"])


def test_render_is_deterministic_and_varies_with_seed():
    m = meta("three red squares")
    assert np.array_equal(S.render(m, seed=5), S.render(m, seed=5))
    assert not np.array_equal(S.render(m, seed=5), S.render(m, seed=6))
    # an uncoloured prompt gets a palette colour
    img = S.render(meta("a square"), seed=1)
    objs, _ = S.segment_objects(img)
    assert len(objs) == 1 and objs[0]["color"] in S.COLORS


def test_cli_writes_jsonl_and_images(tmp_path):
    out = tmp_path / "p.jsonl"
    assert S.main(["--n", "5", "--split", "heldout", "--seed", "2", "--out", str(out),
                   "--images", str(tmp_path / "img"), "--size", "32"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 5 and all(r["split"] == "heldout" for r in rows)
    for r in rows:
        img = np.asarray(Image.open(r["image"]).convert("RGB"))
        assert S.verify(img, r)["correct"]
