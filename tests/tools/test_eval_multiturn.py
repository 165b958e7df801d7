"""eval/generate_vlm.py with tools.enabled: the trainer's tool loop runs per item and each prediction row reports its
turns, tool calls and tokens; metrics.json sums them."""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CALL = '<tool_call>{"name": "crop", "arguments": {"bbox_2d": [0, 0, 28, 28]}}</tool_call>'


def test_generate_vlm_runs_the_multiturn_loop(tmp_path, tiny_dir, scripted, monkeypatch):
    import types

    from PIL import Image

    from eval import generate_vlm
    from mmgrpo.vlm.models import rollout
    from mmgrpo.vlm.models.tiny import synthetic_image

    anns = []
    for i in range(2):
        synthetic_image(i, 56, 56).save(tmp_path / f"im{i}.png")
        anns.append({"id": f"q{i}", "task": "mcq", "image": f"im{i}.png", "query": "which colour?",
                     "options": ["red", "green"], "answer": "B"})
    ann = tmp_path / "a.jsonl"
    ann.write_text("".join(json.dumps(a) + "\n" for a in anns))
    real = rollout.HFRolloutBackend

    def backend(model, processor, suppress, **kw):  # first turn scripted (a random model calls no tool)
        t = types.SimpleNamespace(model=model, tok=processor.tokenizer, suppress=suppress)
        return scripted(t, [CALL], then=real(model, processor, suppress, **kw))

    monkeypatch.setattr(rollout, "HFRolloutBackend", backend)
    out = tmp_path / "run"
    rc = generate_vlm.main([f"model={tiny_dir}", f"data.annotations={ann}", f"data.media_root={tmp_path}",
                            "data.task=mcq", "data.prompt_mode=no_think", "data.image_min_pixels=3136",
                            "data.image_max_pixels=3136", f"out_dir={out}", "decoding.max_new_tokens=4",
                            "decoding.batch_size=2", "tools.enabled=true", "tools.names=[crop]", "tools.max_turns=2",
                            "tools.max_total_tokens=400", "tools.crop_pixels=3136", "progress=false"])
    assert rc == 0
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    for p in preds:
        assert (p["turns"], p["tool_calls"], p["tool_failures"], p["tools_called"]) == (2, 1, 0, ["crop"])
        assert p["visual_tokens"] == 4 and p["policy_tokens"] == p["n_tokens"] and p["tool_tokens"] > 0
        assert p["turn_texts"][0] == CALL and p["output"] == p["turn_texts"][1]
    m = json.loads((out / "metrics.json").read_text())
    assert m["generation"]["tools"]["mean_tool_calls"] == 1.0 and m["generation"]["tools"]["n"] == 2
    s = json.loads((out / "settings.json").read_text())
    assert s["tools"]["enabled"] is True
