"""The text-reward server and the ``remote`` open reward (mmgrpo.vlm.rewards.server / .remote): a judge behind
the shared score service (mmgrpo.utils.score_service) on 127.0.0.1."""
import contextlib
import math
import threading
import time

import pytest

from mmgrpo.vlm.rewards.judge import JudgeReward
from mmgrpo.vlm.rewards.remote import RemoteRewardError, RemoteTextReward
from mmgrpo.vlm.rewards.server import main, make_text_server

SAMPLES = [{"id": f"s{i}", "query": "What is shown?", "answer": a} for i, a in enumerate(["red", "blue", "green"])]


@contextlib.contextmanager
def served(reward, name="judge", **kw):
    srv = make_text_server(reward, name, "127.0.0.1", 0, **kw)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}/score"
    finally:
        srv.shutdown()
        srv.server_close()


def scripted_judge():
    """Replies 'Score: 10' when the answer names the reference, 'Score: 3' otherwise, and no score for 'mumble'."""
    def gen(prompts):
        out = []
        for p in prompts:
            ref, ans = p.split("R=")[1].split(" A=")
            out.append("no idea" if "mumble" in ans else f"Score: {10 if ref in ans else 3}")
        return out
    return JudgeReward(generate=gen, template="R={reference} A={answer}", batch_size=2)


def test_remote_judge_equals_local_by_hand_and_batches():
    comps = ["<answer>red</answer>", "<answer>mumble</answer>", "it is green"]
    local = scripted_judge()(comps, SAMPLES)
    assert local == {"score": [1.0, 0.0, 1.0], "judge/parse_failed": [0.0, 1.0, 0.0]}  # by hand
    judge = scripted_judge()
    with served(judge) as (srv, url):
        remote = RemoteTextReward(url, batch_size=2)
        got = remote(comps, SAMPLES)
        assert got == {"score": [1.0, 0.0, 1.0], "parse_failed": [0.0, 1.0, 0.0]}
        assert dict(srv.stats) == {"requests": 2, "scored_calls": 2, "scored_rows": 3}  # 2 + 1 rows
        assert judge.replies == 3 and judge.parse_failures == 1  # counted on the server's judge
        assert remote.stats["calls"] == 2 and remote.stats["failed_calls"] == 0


def test_real_tiny_judge_folder_behind_the_server(tmp_path):
    """A real (random) causal-LM folder: the served judge equals the in-process one, reply for reply."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    Qwen2ForCausalLM(cfg).save_pretrained(tmp_path / "judge")
    tok.save_pretrained(tmp_path / "judge")
    kw = dict(template="Ref {reference}. Answer {answer}. Score 0-{scale}:", max_new_tokens=3, batch_size=2)
    comps = ["<answer>red</answer>", "blue", "<answer>7</answer>"]
    local = JudgeReward(str(tmp_path / "judge"), **kw)
    want = local(comps, SAMPLES)
    with served(JudgeReward(str(tmp_path / "judge"), **kw)) as (_, url):
        got = RemoteTextReward(url)(comps, SAMPLES)
    assert got["score"] == want["score"] and got["parse_failed"] == want["judge/parse_failed"]
    # no code execution on load: pickled weights are refused, naming the folder
    (tmp_path / "pickled").mkdir()
    cfg.save_pretrained(tmp_path / "pickled")
    torch.save(Qwen2ForCausalLM(cfg).state_dict(), tmp_path / "pickled" / "pytorch_model.bin")
    tok.save_pretrained(tmp_path / "pickled")
    with pytest.raises(ValueError, match="pickled.*no .safetensors"):
        JudgeReward(str(tmp_path / "pickled"))


def test_limits_errors_and_counted_failures():
    calls = []

    def reward(completions, samples):
        calls.append(len(completions))
        if completions[0] == "refuse":
            raise ValueError("cannot score that")
        if completions[0] == "crash":
            raise RuntimeError("out of memory")
        if completions[0] == "slow":
            time.sleep(1.0)
        return [0.5] * len(completions)

    with served(reward, "r", max_rows=2, max_chars=80) as (srv, url):
        client = RemoteTextReward(url, retries=1, backoff=0.0, timeout=5)
        with pytest.raises(RemoteRewardError, match="HTTP 413.*3 completions.*--max-rows"):
            client(["a", "b", "c"], SAMPLES)
        assert client.client.last_attempts == 1  # a 4xx is not retried
        with pytest.raises(RemoteRewardError, match="HTTP 413.*--max-chars"):
            client(["x" * 81], SAMPLES[:1])
        with pytest.raises(RemoteRewardError, match="HTTP 422.*cannot score"):
            client(["refuse"], SAMPLES[:1])
        with pytest.raises(RemoteRewardError, match="after 2 attempt.*HTTP 500.*out of memory"):
            client(["crash"], SAMPLES[:1])
        assert client.client.last_attempts == 2  # a 5xx is retried
        with pytest.raises(RemoteRewardError, match="timeout"):
            RemoteTextReward(url, retries=0, timeout=0.3)(["slow"], SAMPLES[:1])
        with pytest.raises(RemoteRewardError, match="field 'clip'.*reward.kwargs.remote.fields"):
            client(["a"], [dict(SAMPLES[0], clip=object())])
        assert RemoteTextReward(url, fields=["id"])(["a"], [dict(SAMPLES[0], clip=object())]) == {"score": [0.5]}
        st = dict(srv.stats)
        assert st["failed_413"] == 2 and st["failed_422"] == 1 and st["failed_500"] == 2
        # 413, 413, 422, 500 (after 2 failed attempts); the unserialisable sample never reached the client
        assert client.stats["failed_calls"] == 4 and client.stats["failed_attempts"] == 2
    assert calls[:3] == [1, 1, 1]  # refused requests never reached the reward
    with pytest.raises(ValueError, match="loopback"):
        make_text_server(reward, "r", "0.0.0.0", 0)


def test_token_signs_requests(monkeypatch):
    with served(lambda c, s: [1.0] * len(c), "r", token="s3cret") as (_, url):
        monkeypatch.delenv("MMGRPO_REWARD_TOKEN", raising=False)
        with pytest.raises(RemoteRewardError, match="HTTP 401.*set MMGRPO_REWARD_TOKEN"):
            RemoteTextReward(url)(["a"], SAMPLES[:1])
        monkeypatch.setenv("MMGRPO_REWARD_TOKEN", "s3cret")
        assert RemoteTextReward(url)(["a"], SAMPLES[:1]) == {"score": [1.0]}


def test_valid_flag_and_nan_pass_through():
    with served(lambda c, s: {"score": [math.nan, 0.25]}, "r") as (_, url):
        out = RemoteTextReward(url)(["a", "b"], SAMPLES[:2])
    assert math.isnan(out["score"][0]) and out["score"][1] == 0.25


def test_cli_refuses_what_is_not_an_open_reward(capsys):
    with pytest.raises(SystemExit):
        main(["--reward", "iou"])
    assert "'judge' or an import path" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--reward", "judge", "--reward-kwargs", "{}"])
    assert "--reward-kwargs.model" in capsys.readouterr().err
