"""vLLM backend against a FAKE engine with exactly the vLLM 0.33 API surface the backend calls (no vLLM, no GPU).

``FakeLLM`` mirrors ``vllm.LLM``'s signatures (``generate(prompts, sampling_params=None, *, use_tqdm=True,
lora_request=None, priority=None, tokenization_kwargs=None, mm_processor_kwargs=None)``, the ``RLOfflineMixin``
weight methods, ``reset_prefix_cache``, ``get_world_size``); ``FakeSamplingParams`` has ``vllm.SamplingParams``'
field names and rejects any other; outputs have ``RequestOutput`` / ``CompletionOutput`` / ``Logprob`` attributes.
"""
import dataclasses
import http.server
import json
import math
import os
import threading

import numpy as np
import pytest
import torch

from mmgrpo.core.importance import truncated_is_weights
from mmgrpo.vlm.models.rollout import SamplingParams
from mmgrpo.vlm.models.vllm_backend import (VIDEO_MM_PROCESSOR_KWARGS, EngineOutput, LocalEngine, VisionTokenMismatch,
                                        VLLMRolloutBackend, WeightPusher, collapse_vision_runs, colocate_backend,
                                        hf_named_weights, sync_parameter_names, video_item,
                                        vllm_requests)

torch.set_num_threads(1)


# ----------------------------------------------------------------------------------------------------------
# the fake engine
# ----------------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class FakeSamplingParams:  # vllm.SamplingParams field names (0.33.0), the subset with defaults we rely on
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    logit_bias: dict | None = None


@dataclasses.dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None
    logprobs: list | None


@dataclasses.dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list
    prompt_logprobs: object
    outputs: list
    finished: bool


class FakeLLM:
    """``vllm.LLM`` stand-in: records every call; expands each vision placeholder to ``expand[modality]`` tokens
    (what vLLM's ``_apply_prompt_updates`` does); samples ``seed``-determined tokens ending with ``eos``."""

    def __init__(self, model=None, expand=None, eos=2, vocab=(20, 21, 22, 23), length=3, **engine_kwargs):
        self.model, self.engine_kwargs = model, engine_kwargs
        self.expand = dict(expand or {})  # token id -> run length
        self.eos, self.vocab, self.length = eos, list(vocab), length
        self.calls = []

    def generate(self, prompts, sampling_params=None, *, use_tqdm=True, lora_request=None, priority=None,
                 tokenization_kwargs=None, mm_processor_kwargs=None):
        self.calls.append(("generate", prompts, sampling_params))
        assert len(prompts) == len(sampling_params)
        outs = []
        for i, (p, sp) in enumerate(zip(prompts, sampling_params)):
            ids = []
            for t in p["prompt_token_ids"]:
                ids += [t] * self.expand.get(t, 1)
            rng = np.random.RandomState(sp.seed)
            toks = [int(x) for x in rng.choice(self.vocab, self.length)] + [self.eos]
            toks = toks[:sp.max_tokens]
            lps = [-(0.25 + 0.5 * k) for k in range(len(toks))]
            outs.append(RequestOutput(str(i), None, ids, None, [CompletionOutput(
                0, "", toks, sum(lps), [{t: Logprob(lp, 1)} for t, lp in zip(toks, lps)])], True))
        return outs

    def init_weight_transfer_engine(self, request):
        self.calls.append(("init_weight_transfer_engine", request))

    def start_weight_update(self):
        self.calls.append(("start_weight_update",))

    def update_weights(self, request):
        self.calls.append(("update_weights", request))

    def finish_weight_update(self, weight_version=None):
        self.calls.append(("finish_weight_update", weight_version))

    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        self.calls.append(("reset_prefix_cache",))
        return True

    def get_world_size(self, include_dp=True):
        return 2


class FakeTransfer:
    """The control-plane sequence of vLLM's trainer-side transfer engines (``trainer_init`` ->
    ``init_weight_transfer_engine``; ``send_weights`` -> start / update(names, dtype_names, shapes) / finish),
    recording the tensors the data plane would carry."""

    def __init__(self, client, source):
        self.client, self.source, self.sent = client, source, []
        client.init_weight_transfer_engine({"packed": False})

    def send_weights(self):
        self.client.start_weight_update()
        names, dtypes, shapes, tensors = [], [], [], []
        for n, t in self.source.iter_full():
            names.append(n)
            dtypes.append(str(t.dtype).split(".")[-1])
            shapes.append(list(t.shape))
            tensors.append(t.clone())
        self.client.update_weights({"names": names, "dtype_names": dtypes, "shapes": shapes})
        self.client.finish_weight_update()
        self.sent.append(dict(zip(names, tensors)))


class ModelSource:
    """Pure-python stand-in for ``make_weight_source`` (same iteration, no vLLM base class)."""

    def __init__(self, model):
        self.model = model

    def iter_full(self):
        yield from hf_named_weights(self.model)


# ----------------------------------------------------------------------------------------------------------
# requests
# ----------------------------------------------------------------------------------------------------------
def _clip():
    from mmgrpo.video import load_video

    fr = np.random.RandomState(0).randint(0, 255, (12, 56, 84, 3), dtype=np.uint8)
    return load_video(fr, fps=2.0, video_fps=6.0, min_pixels=3136, max_pixels=56 * 84)


def test_collapse_vision_runs():
    assert collapse_vision_runs([1, 6, 6, 6, 9, 7, 7, 3, 6], [6, 7]) == [1, 6, 9, 7, 3, 6]
    assert collapse_vision_runs([5, 5, 5], [6, 7]) == [5, 5, 5]  # repeated text tokens are kept


def test_video_item_carries_the_hf_path_time_axis():
    clip = _clip()
    frames, meta = video_item(clip)
    assert frames.dtype == np.uint8 and frames.shape == (4, 56, 84, 3) and np.array_equal(frames, clip.frames.numpy())
    # the same VideoMetadata fields the HF path passes (build_video_inputs -> clip.video_metadata())
    hf = clip.video_metadata()
    for k in ("total_num_frames", "fps", "width", "height", "duration", "video_backend", "frames_indices"):
        assert meta[k] == getattr(hf, k), k
    assert meta["do_sample_frames"] is False
    # by hand: 12 decoded frames at 6 fps, 4 sampled -> 2 fps, 1 s per temporal grid slice of 2 frames
    assert meta["frames_indices"] == [0, 4, 7, 11] and meta["total_num_frames"] == 12 and meta["fps"] == 6.0
    sampled_fps = len(meta["frames_indices"]) / meta["total_num_frames"] * meta["fps"]
    assert sampled_fps == 2.0 and 2 / sampled_fps == clip.second_per_grid_ts() == 1.0


def test_requests_token_ids_media_and_sampling_params():
    clip = _clip()
    img = object()
    items = [{"input_ids": torch.tensor([[0, 0, 10, 6, 6, 6, 11]]),
              "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1, 1]]), "pixel_values": torch.zeros(3, 4)},
             {"input_ids": torch.tensor([[10, 7, 7, 7, 7, 11]]), "pixel_values_videos": torch.zeros(4, 4)},
             {"input_ids": torch.tensor([[12, 13]])}]
    raws = [{"images": [img]}, {"clip": clip, "video": clip.frames}, {}]
    sp = SamplingParams(max_new_tokens=5, temperature=0.7, top_k=0)
    reqs = vllm_requests(items, raws, 2, sp, seeds=[1, 2, 3, 4, 2**31 + 5, 6], vision_pad_ids=[6, 7],
                         suppress_token_ids=[6, 7])
    assert len(reqs) == 6
    assert [r["prompt_token_ids"] for r, _ in reqs] == [[10, 6, 11]] * 2 + [[10, 7, 11]] * 2 + [[12, 13]] * 2
    assert reqs[0][0]["multi_modal_data"] == {"image": [img]} and "mm_processor_kwargs" not in reqs[0][0]
    frames, meta = reqs[2][0]["multi_modal_data"]["video"]
    assert np.array_equal(frames, clip.frames.numpy()) and meta["frames_indices"] == [0, 4, 7, 11]
    assert reqs[2][0]["mm_processor_kwargs"] == VIDEO_MM_PROCESSOR_KWARGS
    assert "multi_modal_data" not in reqs[4][0]
    kw = reqs[0][1]
    assert kw == {"n": 1, "max_tokens": 5, "logprobs": 0, "temperature": 0.7, "top_p": 1.0, "top_k": 0,
                  "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0,
                  "min_tokens": 0, "logit_bias": {6: -100.0, 7: -100.0}, "seed": 1}
    assert [k["seed"] for _, k in reqs] == [1, 2, 3, 4, (2**31 + 5) % (2**31 - 1), 6]
    FakeSamplingParams(**kw)  # every key is a vllm.SamplingParams field
    assert vllm_requests(items[2:], None, 1, SamplingParams(greedy=True), None)[0][1]["temperature"] == 0.0


def test_requests_refuse_video_without_fps_and_missing_media():
    items = [{"input_ids": torch.tensor([[10, 7, 11]]), "pixel_values_videos": torch.zeros(1)}]
    with pytest.raises(ValueError, match="no fps"):
        vllm_requests(items, [{"video": np.zeros((2, 28, 28, 3))}], 1, SamplingParams(), None)
    with pytest.raises(ValueError, match="no raw images / clip"):
        vllm_requests(items, None, 1, SamplingParams(), None)
    with pytest.raises(ValueError, match="one seed per row"):
        vllm_requests(items, [{"clip": _clip()}], 2, SamplingParams(), [1])


# ----------------------------------------------------------------------------------------------------------
# generate through the fake LLM
# ----------------------------------------------------------------------------------------------------------
def _tok():
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


def test_generate_outputs_and_prompt_check():
    tok = _tok()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    vid = tok.convert_tokens_to_ids("<|video_pad|>")
    llm = FakeLLM(expand={vid: 3}, eos=eos)
    be = VLLMRolloutBackend(LocalEngine(llm, FakeSamplingParams), tok, suppress_token_ids=[vid])
    items = [{"input_ids": torch.tensor([[10, vid, vid, vid, 11]]), "pixel_values_videos": torch.zeros(1)}]
    out = be.generate(items, 2, SamplingParams(max_new_tokens=6), seeds=[5, 9], raw_prompts=[{"clip": _clip()}])
    (_, prompts, sps), = llm.calls
    assert prompts[0]["prompt_token_ids"] == [10, vid, 11] and [s.seed for s in sps] == [5, 9]
    assert all(s.logprobs == 0 and s.n == 1 for s in sps)
    assert out.completion_ids.shape == (2, 4) and out.completion_mask.tolist() == [[1, 1, 1, 1]] * 2
    assert out.completion_ids[:, -1].tolist() == [eos, eos] and out.prompt_index.tolist() == [0, 0]
    assert torch.allclose(out.logprobs[0], torch.tensor([-0.25, -0.75, -1.25, -1.75]))
    assert out.truncated.tolist() == [False, False]
    # an engine answer without sampled-token log-probs is refused (zeros would corrupt the IS weights)
    be.engine = type("NoLogprobs", (), {"run": lambda self, reqs: [
        dataclasses.replace(o, logprobs=None) for o in LocalEngine(llm, FakeSamplingParams).run(reqs)]})()
    with pytest.raises(RuntimeError, match="no sampled-token log-probs"):
        be.generate(items, 1, SamplingParams(max_new_tokens=6), seeds=[5], raw_prompts=[{"clip": _clip()}])
    be.engine = LocalEngine(llm, FakeSamplingParams)
    # the engine expanding another number of vision tokens than the trainer's processor is an error
    llm.expand = {vid: 4}
    with pytest.raises(VisionTokenMismatch, match="row 0"):
        be.generate(items, 1, SamplingParams(max_new_tokens=6), seeds=[5], raw_prompts=[{"clip": _clip()}])


# ----------------------------------------------------------------------------------------------------------
# weight sync
# ----------------------------------------------------------------------------------------------------------
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 4)
        self.q_proj = torch.nn.Linear(4, 3)
        self.v_proj = torch.nn.Linear(3, 2, bias=False)


def test_colocate_engine_kwargs_and_full_weight_push():
    torch.manual_seed(0)
    model = Tiny()
    model.embed.weight.requires_grad_(False)
    made = {}
    be = colocate_backend("/models/x", _tok(), llm_cls=FakeLLM, sampling_params_cls=FakeSamplingParams,
                          transfer_factory=lambda c, s: made.setdefault("t", FakeTransfer(c, s)),
                          gpu_memory_utilization=0.25, seed=3,
                          mm_processor_kwargs={"size": {"shortest_edge": 3136, "longest_edge": 3136}})
    llm = be.engine.llm
    assert llm.model == "/models/x"
    assert llm.engine_kwargs == {"gpu_memory_utilization": 0.25, "max_model_len": 8192,
                                 "mm_processor_kwargs": {"size": {"shortest_edge": 3136, "longest_edge": 3136}},
                                 "enable_prefix_caching": True, "generation_config": "vllm",
                                 "logprobs_mode": "processed_logprobs", "weight_transfer_config": {"backend": "ipc"},
                                 "seed": 3}
    be.pusher.source_factory = ModelSource  # vLLM's WeightSource base class is not installed here
    be.sync_weights(model)
    with torch.no_grad():
        model.q_proj.weight.add_(1.0)
    be.sync_weights(model)
    names = [c[0] for c in llm.calls]
    assert names == ["init_weight_transfer_engine"] + ["start_weight_update", "update_weights",
                                                        "finish_weight_update", "reset_prefix_cache"] * 2
    assert llm.calls[0][1] == {"init_info": {"packed": False}}
    upd = llm.calls[2][1]["update_info"]
    assert upd == {"names": ["q_proj.weight", "q_proj.bias", "v_proj.weight"],  # frozen embedding not sent
                   "dtype_names": ["float32"] * 3, "shapes": [[3, 4], [3], [2, 3]]}
    sent = made["t"].sent
    assert len(sent) == 2 and torch.equal(sent[1]["q_proj.weight"] - sent[0]["q_proj.weight"], torch.ones(3, 4))
    assert torch.equal(sent[1]["v_proj.weight"], model.v_proj.weight)


def test_lora_push_sends_merged_base_weights_under_hf_names_and_unmerges():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(Tiny(), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"],
                                              init_lora_weights=False))
    W0 = model.base_model.model.q_proj.base_layer.weight.detach().clone()
    A = model.base_model.model.q_proj.lora_A["default"].weight.detach()
    B = model.base_model.model.q_proj.lora_B["default"].weight.detach()
    names = sync_parameter_names(model)
    assert names == ["base_model.model.q_proj.base_layer.weight", "base_model.model.q_proj.base_layer.bias",
                     "base_model.model.v_proj.base_layer.weight"]
    t = FakeTransfer(_Recorder(), ModelSource(model))
    t.send_weights()
    sent = t.sent[0]
    assert list(sent) == ["q_proj.weight", "q_proj.bias", "v_proj.weight"]
    assert torch.allclose(sent["q_proj.weight"], W0 + (4 / 2) * B @ A, atol=1e-6)  # merged by hand: W + (a/r) BA
    # merged out of place: the trainer's base weights are bit-for-bit untouched (merge + unmerge would round)
    assert torch.equal(model.base_model.model.q_proj.base_layer.weight, W0)
    assert torch.equal(sent["q_proj.bias"], model.base_model.model.q_proj.base_layer.bias)


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *a, **k: self.calls.append((name, a, k))


def test_pusher_pushes_once_per_sync_and_builds_transfer_once():
    built = []

    class T:
        n = 0

        def send_weights(self):
            T.n += 1

    resets = []
    p = WeightPusher("client", lambda c, s: built.append((c, s)) or T(), lambda: resets.append(1),
                     source_factory=lambda m: ("src", m))
    for _ in range(3):
        p.push("model")
    assert built == [("client", ("src", "model"))] and T.n == 3 and len(resets) == 3 and p.pushes == 3


# ----------------------------------------------------------------------------------------------------------
# server mode: the client's HTTP requests, and a round trip through make_server with the fake LLM
# ----------------------------------------------------------------------------------------------------------
class _RecordingHandler(http.server.BaseHTTPRequestHandler):
    log: list = []

    def _reply(self, obj):
        raw = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):  # noqa: N802
        self.log.append(("GET", self.path, None))
        self._reply({"status": "ok"} if self.path == "/health" else {"world_size": 4})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.log.append(("POST", self.path, body))
        if self.path == "/generate":
            self._reply({"outputs": [{"prompt_token_ids": [1], "token_ids": [2], "logprobs": [-0.5]}]})
        else:
            self._reply({"status": "ok"})

    def log_message(self, *a):
        pass


def _serve(server):
    th = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    return th


def test_server_client_http_requests():
    from mmgrpo.vlm.models.vllm_client import VLLMServerClient

    _RecordingHandler.log = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingHandler)
    th = _serve(srv)
    try:
        c = VLLMServerClient(f"http://127.0.0.1:{srv.server_address[1]}/", timeout=5)
        assert c.health() and c.world_size() == 4
        outs = c.run([({"prompt_token_ids": [10, 11]}, {"n": 1, "seed": 3, "logit_bias": {6: -100.0}})])
        assert outs[0].token_ids == [2] and outs[0].logprobs == [-0.5]
        c.init_weight_transfer_engine({"master_address": "10.0.0.1", "master_port": 51216, "rank_offset": 1,
                                       "world_size": 5})
        c.start_weight_update()
        c.update_weights({"names": ["a"], "dtype_names": ["bfloat16"], "shapes": [[2, 3]]})
        c.finish_weight_update()
        c.reset_prefix_cache()
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)
    assert _RecordingHandler.log == [
        ("GET", "/health", None), ("GET", "/get_world_size", None),
        ("POST", "/generate", {"requests": [{"prompt": {"prompt_token_ids": [10, 11]},
                                             "sampling": {"n": 1, "seed": 3, "logit_bias": {"6": -100.0}}}]}),
        ("POST", "/init_weight_transfer_engine", {"init_info": {"master_address": "10.0.0.1", "master_port": 51216,
                                                               "rank_offset": 1, "world_size": 5}}),
        ("POST", "/start_weight_update", {}),
        ("POST", "/update_weights", {"update_info": {"names": ["a"], "dtype_names": ["bfloat16"],
                                                     "shapes": [[2, 3]]}}),
        ("POST", "/finish_weight_update", {"weight_version": None}),
        ("POST", "/reset_prefix_cache", {}),
    ]
    with pytest.raises(ValueError, match="http"):
        VLLMServerClient("localhost:8000")


def test_server_round_trip_with_fake_llm():
    from PIL import Image

    from mmgrpo.vlm.models.vllm_client import VLLMServerClient
    from mmgrpo.vlm.models.vllm_server import make_server

    tok = _tok()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    img_id, vid_id = tok.convert_tokens_to_ids("<|image_pad|>"), tok.convert_tokens_to_ids("<|video_pad|>")
    llm = FakeLLM(expand={img_id: 2, vid_id: 3}, eos=eos)
    srv = make_server(llm, "127.0.0.1", 0, FakeSamplingParams)
    th = _serve(srv)
    try:
        client = VLLMServerClient(f"http://127.0.0.1:{srv.server_address[1]}", timeout=5)
        be = VLLMRolloutBackend(client, tok, suppress_token_ids=[img_id, vid_id])
        clip = _clip()
        im = Image.fromarray(np.arange(28 * 28 * 3, dtype=np.uint8).reshape(28, 28, 3))
        items = [{"input_ids": torch.tensor([[10, img_id, img_id, 11]]), "pixel_values": torch.zeros(1)},
                 {"input_ids": torch.tensor([[10, vid_id, vid_id, vid_id, 11]]), "pixel_values_videos": torch.zeros(1)}]
        out = be.generate(items, 1, SamplingParams(max_new_tokens=8), seeds=[4, 5],
                          raw_prompts=[{"images": [im]}, {"clip": clip}])
        assert out.completion_ids.shape[0] == 2 and torch.allclose(out.logprobs[1, :2], torch.tensor([-0.25, -0.75]))
        (_, prompts, sps), = [c for c in llm.calls if c[0] == "generate"]
        assert np.array_equal(np.asarray(prompts[0]["multi_modal_data"]["image"][0]), np.asarray(im))
        frames, meta = prompts[1]["multi_modal_data"]["video"]
        assert np.array_equal(frames, clip.frames.numpy()) and meta == video_item(clip)[1]
        assert prompts[1]["mm_processor_kwargs"] == VIDEO_MM_PROCESSOR_KWARGS
        assert sps[0].logit_bias == {img_id: -100.0, vid_id: -100.0} and [s.seed for s in sps] == [4, 5]
        # weight routes reach the LLM's RL methods with vLLM's request shapes
        client.init_weight_transfer_engine({"world_size": 3})
        client.start_weight_update()
        client.update_weights({"names": ["x"], "dtype_names": ["float32"], "shapes": [[1]]})
        client.finish_weight_update("v1")
        client.reset_prefix_cache()
        assert client.world_size() == 2
        with pytest.raises(RuntimeError, match="HTTP 404"):
            client._call("POST", "/nope", {})
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(5)
    assert [c for c in llm.calls if c[0] != "generate"] == [
        ("init_weight_transfer_engine", {"init_info": {"world_size": 3}}), ("start_weight_update",),
        ("update_weights", {"update_info": {"names": ["x"], "dtype_names": ["float32"], "shapes": [[1]]}}),
        ("finish_weight_update", "v1"), ("reset_prefix_cache",)]


# ----------------------------------------------------------------------------------------------------------
# truncated importance sampling
# ----------------------------------------------------------------------------------------------------------
def test_truncated_is_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, -0.1], [-0.3, 0.0, 0.0, 0.0]])
    engine = torch.tensor([[-1.2, -1.0, -0.5, -2.0], [-0.3, -9.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    w = truncated_is_weights(trainer, engine, mask, cap=2.0)
    want = [[math.exp(0.2), math.exp(-1.0), 1.0, 2.0],  # exp(1.9) = 6.69 truncated to the cap
            [1.0, 1.0, 1.0, 1.0]]  # masked: 1 (exp(9) would be 8103)
    assert torch.allclose(w, torch.tensor(want), atol=1e-6)
    assert torch.allclose(truncated_is_weights(trainer, engine, mask, cap=10.0)[0, 3], torch.tensor(math.exp(1.9)))
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(trainer, engine, mask, cap=0.0)


def test_is_weights_multiply_the_policy_term_like_trl():
    """The policy loss with token_weights=w at ratio 1: per-token loss -A*w, token-mean (TRL: per_token_loss *
    is_ratio)."""
    from mmgrpo.vlm.config import AlgoConfig
    from mmgrpo.vlm.methods.base import LossInputs, grpo_loss

    lp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    w = torch.tensor([[0.5, 2.0, 1.0]])
    out = grpo_loss(LossInputs(lp, lp.detach(), torch.tensor([1.5]), torch.ones(1, 3), token_weights=w,
                               algo=AlgoConfig()))
    assert torch.allclose(out.loss, torch.tensor(-(1.5 * 0.5 + 1.5 * 2.0 + 1.5 * 1.0) / 3))


def test_engine_pinned_to_this_process_gpu(monkeypatch):
    from mmgrpo.vlm.models import vllm_backend as vb

    seen = []
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    with vb.engine_on_this_gpu():
        seen.append(os.environ["CUDA_VISIBLE_DEVICES"])
    assert seen == ["6"] and os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"


def test_vllm_processor_call_gives_the_hf_path_video_tensors_and_time_axis():
    """What vLLM 0.33's Qwen2.5-VL processor does with our video item -- ``VideoMetadata(**meta minus
    do_sample_frames)`` + the request's ``mm_processor_kwargs`` into the HF processor -- reproduces the HF path's
    pixels, grid and second_per_grid_ts (= 2 / sample_fps = 1.0 s here); the old backend's bare frames get 2/24."""
    from transformers.video_utils import VideoMetadata

    from mmgrpo.vlm.models.tiny import build_tiny_processor
    from mmgrpo.video import build_video_inputs

    proc = build_tiny_processor("qwen2_5_vl")
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "when?"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    clip = _clip()
    hf = build_video_inputs(proc, clip, text, "qwen2_5_vl")
    frames, meta = video_item(clip)
    md = VideoMetadata(**{k: v for k, v in meta.items() if k != "do_sample_frames"})
    out = proc(text=[text], videos=[frames], video_metadata=[md], return_tensors="pt", **VIDEO_MM_PROCESSOR_KWARGS)
    for k in ("input_ids", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts"):
        assert torch.equal(out[k], hf[k]), k
    assert float(out["second_per_grid_ts"][0]) == pytest.approx(2 / clip.sample_fps) == pytest.approx(1.0)
    # the request's token ids: the HF ids with the video run collapsed == the rendered text's tokens
    vid = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert collapse_vision_runs(hf["input_ids"][0].tolist(), [vid]) == proc.tokenizer(text).input_ids
    bare = proc(text=[text], videos=[frames], return_tensors="pt", **VIDEO_MM_PROCESSOR_KWARGS)
    assert float(bare["second_per_grid_ts"][0]) == pytest.approx(2 / 24)  # the trap without metadata


def test_vllm_version_check():
    from mmgrpo.vlm.models.vllm_backend import check_vllm_version

    for ok in ("0.33.0", "0.33.1+cu128", "0.34.0rc1", "1.0.0"):
        check_vllm_version(ok)
    for old in ("0.10.2", "0.32.9"):
        with pytest.raises(ImportError, match="older than 0.33.0"):
            check_vllm_version(old)


# ----------------------------------------------------------------------------------------------------------
# server mode under hostile peers (issue 31 items 4, 5, 8, 9): all on 127.0.0.1, bounded loops, short timeouts
# ----------------------------------------------------------------------------------------------------------
def _raw(port, head, body=b"", wait=3.0):
    """Send a raw request; return (status, JSON reply)."""
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(head.encode("latin-1") + b"\r\n\r\n" + body)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
    assert data, "closed without an answer"
    return int(data.split(b" ", 2)[1]), json.loads(data.partition(b"\r\n\r\n")[2] or b"{}")


def _init_head(port, length, host=None, ctype="application/json", extra=""):
    return (f"POST /init_weight_transfer_engine HTTP/1.1\r\nHost: {host or f'127.0.0.1:{port}'}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {length}\r\nConnection: close{extra}")


class _served:
    """``make_server(FakeLLM(), ...)`` running in a thread: ``with _served(**kw) as (srv, llm, port)``."""

    def __init__(self, **kw):
        from mmgrpo.vlm.models.vllm_server import make_server

        self.llm = FakeLLM()
        self.srv = make_server(self.llm, "127.0.0.1", 0, FakeSamplingParams, **kw)

    def __enter__(self):
        self.th = _serve(self.srv)
        return self.srv, self.llm, self.srv.server_address[1]

    def __exit__(self, *exc):
        self.srv.shutdown()
        self.srv.server_close()
        self.th.join(5)


def test_vllm_server_binds_loopback_unless_remote_is_allowed_with_a_token(monkeypatch):
    from mmgrpo.vlm.models.vllm_server import main, make_server

    monkeypatch.delenv("MMGRPO_VLLM_TOKEN", raising=False)
    with pytest.raises(ValueError, match="refusing to bind '0.0.0.0': loopback addresses only.*--allow-remote"):
        make_server(FakeLLM(), "0.0.0.0", 0, FakeSamplingParams)
    with pytest.raises(ValueError, match="--allow-remote.*requires a token: set MMGRPO_VLLM_TOKEN"):
        make_server(FakeLLM(), "0.0.0.0", 0, FakeSamplingParams, allow_remote=True)
    srv = make_server(FakeLLM(), "0.0.0.0", 0, FakeSamplingParams, allow_remote=True, token="s3cret")
    assert srv.server_address[0] == "0.0.0.0" and srv.token == "s3cret"
    srv.server_close()
    for argv in (["--model", "m", "--host", "0.0.0.0"], ["--model", "m", "--host", "0.0.0.0", "--allow-remote"]):
        with pytest.raises(SystemExit) as ei:  # refused before vLLM is imported or the engine starts
            main(argv)
        assert ei.value.code == 2


def test_vllm_server_refuses_foreign_host_non_json_and_unsigned_requests(monkeypatch):
    """Before the fix: ``POST /init_weight_transfer_engine`` as text/plain with a foreign Host reached
    ``LLM.init_weight_transfer_engine`` (anyone could point the NCCL weight transfer at itself)."""
    monkeypatch.delenv("MMGRPO_VLLM_TOKEN", raising=False)
    body = json.dumps({"init_info": {"master_address": "203.0.113.9", "master_port": 1, "world_size": 2}}).encode()
    with _served() as (srv, llm, port):
        code, r = _raw(port, _init_head(port, len(body), host="attacker.example", ctype="text/plain"), body)
        assert code == 400 and "Host" in r["error"]
        code, r = _raw(port, _init_head(port, len(body), ctype="text/plain"), body)
        assert code == 415 and "application/json" in r["error"]
        assert llm.calls == []
    with _served(token="s3cret") as (srv, llm, port):
        code, r = _raw(port, _init_head(port, len(body)), body)
        assert code == 401 and "MMGRPO_VLLM_TOKEN" in r["error"]
        code, r = _raw(port, _init_head(port, len(body), extra="\r\nAuthorization: Bearer s3cret"), body)
        assert code == 401
        assert llm.calls == []
        from mmgrpo.vlm.models.vllm_client import VLLMServerClient

        url = f"http://127.0.0.1:{port}"
        with pytest.raises(RuntimeError, match="HTTP 401.*set MMGRPO_VLLM_TOKEN"):
            VLLMServerClient(url, timeout=3).init_weight_transfer_engine({"world_size": 2})
        monkeypatch.setenv("MMGRPO_VLLM_TOKEN", "s3cret")  # the trainer with the same token: signed, accepted
        VLLMServerClient(url, timeout=3).init_weight_transfer_engine({"world_size": 2})
        assert llm.calls == [("init_weight_transfer_engine", {"init_info": {"world_size": 2}})]


def test_vllm_server_caps_the_body_and_closes_stalled_requests(monkeypatch):
    """Before the fix: a 300 MB request was read whole (~600 MB more at peak) and a stalled one held its thread
    forever."""
    import socket
    import time

    monkeypatch.delenv("MMGRPO_VLLM_TOKEN", raising=False)
    with _served(max_body_mb=1.0, read_timeout=0.5) as (srv, llm, port):
        t0 = time.perf_counter()
        code, r = _raw(port, _init_head(port, 300 * 2**20))  # announces 300 MB, sends nothing
        assert code == 413 and "300.0 MB" in r["error"] and "--max-body-mb 1" in r["error"]
        assert time.perf_counter() - t0 < 1.0
        stalled = socket.create_connection(("127.0.0.1", port), timeout=3)
        stalled.sendall(_init_head(port, 100).encode() + b"\r\n\r\n" + b"{" * 10)  # 10 of 100 bytes, then nothing
        t0 = time.perf_counter()
        assert stalled.recv(1) == b""  # closed by the server after its read timeout
        assert 0.4 < time.perf_counter() - t0 < 2.0
        stalled.close()
        assert llm.calls == []
        code, _ = _raw(port, "GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close")
        assert code == 200


def test_vllm_client_deadline_and_reply_cap(fake_http, monkeypatch):
    """``timeout`` bounds the whole call (before the fix a reply trickled 1 byte / 0.5 s blocked past 25 s with
    timeout=3), and a reply above ``max_reply_mb`` is refused before it is read (400 MB -> ~800 MB before)."""
    import time

    from mmgrpo.vlm.models.vllm_client import VLLMServerClient

    monkeypatch.delenv("MMGRPO_VLLM_TOKEN", raising=False)
    reply = fake_http.reply({"outputs": [{"prompt_token_ids": [1], "token_ids": [2], "logprobs": [-0.5]}]})
    with fake_http.serve(reply, drip=0.05, drip_from=reply.index(b"\r\n\r\n") + 4) as (url, _):
        client = VLLMServerClient(url.rsplit("/", 1)[0], timeout=0.5)
        t0 = time.perf_counter()
        with pytest.raises(ConnectionError, match="timeout: no complete reply within 0.5 s"):
            client.run([({"prompt_token_ids": [1]}, {"n": 1})])
        assert time.perf_counter() - t0 < 1.5
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 419430400\r\n"
            b"Connection: close\r\n\r\n{")
    with fake_http.serve(head) as (url, _):
        with pytest.raises(RuntimeError, match="announces 419430400 bytes, above the reply cap"):
            VLLMServerClient(url.rsplit("/", 1)[0], timeout=3, max_reply_mb=256).run([({"prompt_token_ids": [1]}, {})])
    redirect = b"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    with fake_http.serve(redirect) as (url, _):
        with pytest.raises(RuntimeError, match="redirects are never followed"):
            VLLMServerClient(url.rsplit("/", 1)[0], timeout=3).world_size()


def test_vllm_client_refuses_unsigned_replies_when_it_has_a_token(fake_http, monkeypatch):
    from mmgrpo.vlm.models.vllm_client import VLLMServerClient

    monkeypatch.setenv("MMGRPO_VLLM_TOKEN", "s3cret")
    with fake_http.serve(fake_http.reply({"world_size": 4})) as (url, heads):
        with pytest.raises(RuntimeError, match="not authenticated"):
            VLLMServerClient(url.rsplit("/", 1)[0], timeout=3).world_size()
    assert b"s3cret" not in heads[0]


def _bad(**change):
    def run(reqs):
        return [EngineOutput(**{"prompt_token_ids": [10, 11], "token_ids": [20, 2], "logprobs": [-0.5, -0.25],
                                **change}) for _ in reqs]
    return type("Engine", (), {"run": lambda self, reqs: run(reqs)})()


@pytest.mark.parametrize("change, match", [
    ({"token_ids": [20, 10**9]}, r"row 0: .*token id 1000000000, outside the vocabulary \[0, "),
    ({"token_ids": [20, -1]}, r"token id -1, outside"),
    ({"logprobs": [-0.5, float("nan")]}, r"log-prob nan"),
    ({"logprobs": [float("-inf"), -0.5]}, r"log-prob -inf"),
    ({"logprobs": [-0.5, 0.5]}, r"log-prob 0.5; a log-probability is finite and <= 0"),
    ({"token_ids": [20] * 1_000_000, "logprobs": [-0.5] * 1_000_000}, r"1000000 tokens for max_new_tokens=6"),
    ({"logprobs": [-0.5]}, r"1 sampled-token log-probs for 2 tokens"),
])
def test_bad_engine_replies_are_failed_calls(change, match):
    """Before the fix: ids >= the vocabulary, NaN / inf / positive log-probs and 1,000,000 tokens for
    max_new_tokens=6 were all accepted."""
    from mmgrpo.vlm.models.vllm_backend import BadEngineReply

    tok = _tok()
    be = VLLMRolloutBackend(_bad(**change), tok, check_prompts=False)
    with pytest.raises(BadEngineReply, match=match):
        be.generate([{"input_ids": torch.tensor([[10, 11]])}], 1, SamplingParams(max_new_tokens=6), seeds=[1])
    assert issubclass(BadEngineReply, RuntimeError)  # the failure path of a failed HTTP call
    out = VLLMRolloutBackend(_bad(), tok, check_prompts=False).generate(
        [{"input_ids": torch.tensor([[10, 11]])}], 1, SamplingParams(max_new_tokens=6), seeds=[1])
    assert out.completion_ids.shape == (1, 2)  # the unchanged reply is fine


def test_vocab_size_is_the_embedding_size_when_given():
    tok = _tok()
    be = VLLMRolloutBackend(_bad(token_ids=[len(tok) + 5, 2]), tok, check_prompts=False, vocab_size=len(tok) + 8)
    be.generate([{"input_ids": torch.tensor([[10, 11]])}], 1, SamplingParams(max_new_tokens=6), seeds=[1])
    assert VLLMRolloutBackend(_bad(), tok).vocab_size == len(tok)


@pytest.mark.parametrize("reply, match", [
    ({"outputs": []}, r"0 outputs for 1 requests"),
    ({"outputs": [{"prompt_token_ids": [1], "token_ids": ["2"], "logprobs": [-0.5]}]},
     r"outputs\[0\]\.token_ids is not a list of integers"),
    ({"outputs": [{"prompt_token_ids": [1], "token_ids": [2], "logprobs": ["x"]}]}, r"logprobs is not a list"),
    ({"nothing": 1}, r"None for 1 requests"),
])
def test_malformed_server_replies_are_failed_calls(fake_http, monkeypatch, reply, match):
    from mmgrpo.vlm.models.vllm_client import VLLMServerClient

    monkeypatch.delenv("MMGRPO_VLLM_TOKEN", raising=False)
    with fake_http.serve(fake_http.reply(reply)) as (url, _):
        with pytest.raises(RuntimeError, match=match):
            VLLMServerClient(url.rsplit("/", 1)[0], timeout=3).run([({"prompt_token_ids": [1]}, {"n": 1})])
