"""SEED-GRPO: clustering, semantic entropy and advantage scaling against hand / torch.distributions values."""
import math

import pytest
import torch
from hypothesis import given, strategies as st

from mmgrpo.vlm.methods.seed_grpo import (box_iou, cluster_by_overlap, cluster_exact, cluster_texts, seed_advantages,
                                      seed_weights, semantic_entropy, span_iou)


def test_cluster_exact_groups_and_unparsed():
    ans = ["A", "A", "B", None, None, "A", "A", "C"]
    gid = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    c = cluster_exact(ans, gid)
    assert c[0] == c[1] and c[0] != c[2]
    assert c[3] == c[4] and c[3] not in (c[0], c[2])  # one shared "no answer" cluster
    assert c[5] == c[6] and c[5] != c[0]  # same letter in another group: another cluster
    own = cluster_exact(ans, gid, unparsed="own")
    assert own[3] != own[4]


def test_overlap_clusters_spans_and_boxes():
    gid = torch.zeros(4, dtype=torch.long)
    spans = [(0.0, 10.0), (1.0, 10.0), (20.0, 30.0), (10.0, 0.0)]  # IoU 0.9; disjoint; reversed copy of the first
    c = cluster_by_overlap(spans, gid, threshold=0.5)
    assert c.tolist()[0] == c.tolist()[1] == c.tolist()[3] != c.tolist()[2]
    assert span_iou((0, 10), (5, 15)) == pytest.approx(5 / 15)
    assert box_iou((0, 0, 2, 2), (1, 1, 3, 3)) == pytest.approx(1 / 7)
    boxes = [(0, 0, 2, 2), (1, 1, 3, 3), (0, 0, 2, 2.1)]
    c = cluster_by_overlap(boxes, torch.zeros(3, dtype=torch.long), threshold=0.5)
    assert c[0] == c[2] != c[1]
    # greedy leader: the second span overlaps the third (IoU 0.6) but is compared with the cluster's first member
    c = cluster_by_overlap([(0, 10), (4, 14), (8, 18)], torch.zeros(3, dtype=torch.long), threshold=0.4)
    assert c[0] == c[1] and c[2] != c[0]  # IoU(0-10, 8-18) = 2/18 < 0.4


def test_semantic_entropy_count_matches_categorical():
    cid = torch.tensor([0, 0, 1, 2, 5, 5, 5, 5])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    se, G = semantic_entropy(cid, gid)
    ref = torch.distributions.Categorical(probs=torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)).entropy().item()
    assert se[0].item() == pytest.approx(ref, abs=1e-12)
    assert se[0].item() == pytest.approx(1.5 * math.log(2))  # by hand
    assert se[4].item() == 0.0 and G.tolist() == [4.0] * 8


def test_semantic_entropy_prob_and_mc_by_hand():
    # two clusters, sequence probabilities e^-1, e^-2 (cluster 0) and e^-3 (cluster 1)
    lp = torch.tensor([-1.0, -2.0, -3.0])
    cid = torch.tensor([0, 0, 1])
    gid = torch.zeros(3, dtype=torch.long)
    z = math.exp(-1) + math.exp(-2) + math.exp(-3)
    p0, p1 = (math.exp(-1) + math.exp(-2)) / z, math.exp(-3) / z
    se, _ = semantic_entropy(cid, gid, lp, "prob")
    assert se[0].item() == pytest.approx(-(p0 * math.log(p0) + p1 * math.log(p1)), rel=1e-12)
    se, _ = semantic_entropy(cid, gid, lp, "mc")
    assert se[0].item() == pytest.approx(-(math.log(p0) + math.log(p1)) / 2, rel=1e-12)
    # length normalisation: lengths 1, 2, 3 -> per-token log-probs -1, -1, -1 -> p = 2/3, 1/3
    se, _ = semantic_entropy(cid, gid, lp, "prob", lengths=torch.tensor([1, 2, 3]))
    assert se[0].item() == pytest.approx(-(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)), rel=1e-12)
    # huge negative log-probs (long answers) do not underflow
    se, _ = semantic_entropy(cid, gid, lp - 5000.0, "prob")
    assert se[0].item() == pytest.approx(-(p0 * math.log(p0) + p1 * math.log(p1)), rel=1e-9)


def test_weights_and_advantages_by_hand():
    # group of 4 with clusters A A B C: SE = 1.5 ln 2, SE_max = ln 4 -> ratio 0.75
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    gid = torch.tensor([0, 0, 0, 0, 1, 1])
    cid = cluster_exact(["A", "A", "B", "C", "x", "x"], gid)
    out, m = seed_advantages(adv, cid, gid, alpha=0.5, fn="linear")
    w = 1 - 0.5 * 0.75
    assert torch.allclose(out, torch.tensor([w, -w, 0.5 * w, -0.5 * w, 2.0, -2.0]))
    assert m["seed/weight_mean"] == pytest.approx((w + 1) / 2)
    assert m["seed/clusters_mean"] == pytest.approx(2.0)
    se = torch.tensor([1.5 * math.log(2)])
    G = torch.tensor([4.0])
    assert seed_weights(se, G, 1.0, "exp").item() == pytest.approx(math.exp(-0.75))
    assert seed_weights(se, G, 1.0, "focal", gamma=2).item() == pytest.approx(0.25 ** 2)
    assert seed_weights(se, G, 2.0, "linear").item() == 0.0  # clamped, never negative
    assert seed_weights(torch.tensor([0.0]), torch.tensor([1.0]), 1.0).item() == 1.0
    tok, _ = seed_advantages(adv.unsqueeze(1).repeat(1, 3), cid, gid)
    assert torch.allclose(tok[:, 0], out) and tok.shape == (6, 3)


@given(st.lists(st.integers(0, 5), min_size=2, max_size=12))
def test_entropy_bounds_property(labels):
    cid = torch.tensor(labels)
    gid = torch.zeros(len(labels), dtype=torch.long)
    se, G = semantic_entropy(cid, gid)
    assert -1e-12 <= se[0].item() <= math.log(len(labels)) + 1e-12
    w = seed_weights(se, G, 1.0)
    assert 0.0 <= w[0].item() <= 1.0
    if len(set(labels)) == len(labels):  # all different: SE = log G, linear weight 1 - alpha
        assert se[0].item() == pytest.approx(math.log(len(labels)))
        assert w[0].item() == pytest.approx(0.0, abs=1e-12)
    if len(set(labels)) == 1:
        assert w[0].item() == 1.0


def test_bad_inputs():
    with pytest.raises(ValueError, match="group_ids"):
        cluster_exact(["A"], torch.tensor([0.0]))
    with pytest.raises(ValueError, match="seq_logp"):
        semantic_entropy(torch.tensor([0, 1]), torch.tensor([0, 0]), estimator="prob")
    with pytest.raises(ValueError, match="threshold"):
        cluster_by_overlap([(0, 1)], torch.tensor([0]), threshold=0.0)
    with pytest.raises(ValueError, match="spans"):
        cluster_by_overlap([(0, 1), (0, 1, 2)], torch.tensor([0, 0]))


def test_cluster_texts_per_task():
    g = torch.zeros(4, dtype=torch.long)
    tvg = ["<answer>1.00 to 5.00</answer>", "<answer>1.50 to 5.00</answer>", "<answer>20 to 30</answer>", "??"]
    c = cluster_texts(tvg, "tvg", g)
    assert c[0] == c[1] != c[2] and c[3] not in (c[0], c[2])
    mcq = ["<answer>(B)</answer>", "<answer>B</answer>", "<answer>(C)</answer>", "nothing"]
    c = cluster_texts(mcq, "mcq", g)
    assert c[0] == c[1] != c[2]
    rec = ["<answer>[0, 0, 10, 10]</answer>", "<answer>[0, 0, 10, 11]</answer>", "<answer>[50, 50, 60, 60]</answer>",
           ""]
    c = cluster_texts(rec, "rec", g)
    assert c[0] == c[1] != c[2]
    with pytest.raises(ValueError, match="task"):
        cluster_texts(["x"], "ocr", torch.zeros(1, dtype=torch.long))
