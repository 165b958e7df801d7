"""geneval_official plumbing with a stand-in for GenEval's evaluate_images.py (the real one needs mmdet + CUDA).

The stand-in has the script's shape: module-level imports (mmdet, init_detector, open_clip), DEVICE, and an
evaluate_image(filepath, metadata) that reads the globals the script's __main__ sets."""
import textwrap

import numpy as np
import pytest

from flow_grpo.rewards import RewardError, build_reward

STUB = textwrap.dedent('''
    import types
    from PIL import Image
    import numpy as np

    mmdet = types.SimpleNamespace(__file__="/opt/mmdet/__init__.py")
    DEVICE = "cpu"
    CALLS = []

    def init_detector(cfg, ckpt, device):
        CALLS.append(("init_detector", cfg, ckpt, device))
        return "detector"

    class _OC:
        @staticmethod
        def create_model_and_transforms(arch, pretrained, device):
            CALLS.append(("clip", arch, pretrained, device))
            return "clip", None, "transform"

        @staticmethod
        def get_tokenizer(arch):
            return "tok"

    open_clip = _OC()

    def evaluate_image(filepath, metadata):
        # "correct" when the image is bright and the expected count is 1, like a detector would decide
        img = np.asarray(Image.open(filepath))
        assert object_detector == "detector" and clip_model == "clip" and THRESHOLD == 0.25
        assert args.options["counting_threshold"] == "0.9" and classnames == ["person", "cat"]
        CALLS.append(("eval", filepath, metadata["prompt"], img.copy()))
        return {"correct": img.mean() > 127 and metadata["include"][0]["count"] == 1}
''')


@pytest.fixture
def geneval(tmp_path):
    ev = tmp_path / "geneval" / "evaluation"
    ev.mkdir(parents=True)
    (ev / "evaluate_images.py").write_text(STUB)
    (ev / "object_names.txt").write_text("person\ncat\n")
    det = tmp_path / "det"
    det.mkdir()
    (det / "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth").write_bytes(b"")
    return str(tmp_path / "geneval"), str(det)


def test_geneval_official_sets_the_scripts_globals_and_scores_pngs(geneval):
    gdir, det = geneval
    r = build_reward("geneval_official", geneval_dir=gdir, detector_path=det, options={"threshold": 0.25})
    imgs = np.stack([np.full((8, 8, 3), v, np.uint8) for v in (200, 200, 30)])
    imgs[0, 0, 0] = [1, 2, 3]
    md = [{"tag": "single_object", "include": [{"class": "cat", "count": c}]} for c in (1, 2, 1)]
    out = r(imgs, ["a cat", "two cats", "a cat"], md)
    assert out["geneval"].tolist() == [1.0, 0.0, 0.0]
    calls = r.module.CALLS
    assert calls[0] == ("init_detector", "/opt/mmdet/../configs/mask2former/"
                        "mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.py",
                        det + "/mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth", "cpu")
    assert calls[1] == ("clip", "ViT-L-14", "openai", "cpu")
    evals = [c for c in calls if c[0] == "eval"]
    assert [c[2] for c in evals] == ["a cat", "two cats", "a cat"] and evals[0][1].endswith(".png")
    assert np.array_equal(evals[0][3], imgs[0])  # lossless hand-over


def test_geneval_official_clear_errors(tmp_path, geneval):
    gdir, det = geneval
    with pytest.raises(FileNotFoundError, match="evaluate_images.py"):
        build_reward("geneval_official", geneval_dir=str(tmp_path / "nope"), detector_path=det)
    with pytest.raises(FileNotFoundError, match="mask2former_swin-s-p4-w7-224_lsj_8x2_50e_coco.pth"):
        build_reward("geneval_official", geneval_dir=gdir, detector_path=str(tmp_path))
    with pytest.raises(ValueError, match="unknown GenEval options"):
        build_reward("geneval_official", geneval_dir=gdir, detector_path=det, options={"thresh": 1})
    r = build_reward("geneval_official", geneval_dir=gdir, detector_path=det, options={"threshold": 0.25})
    with pytest.raises(RewardError, match="lacks GenEval's 'tag'"):
        r(np.zeros((1, 8, 8, 3), np.uint8), ["a cat"], [{"include": []}])
    (tmp_path / "geneval" / "evaluation" / "evaluate_images.py").write_text("import mmdet_missing_xyz\n")
    with pytest.raises(ImportError, match="GenEval's environment"):
        build_reward("geneval_official", geneval_dir=gdir, detector_path=det)
