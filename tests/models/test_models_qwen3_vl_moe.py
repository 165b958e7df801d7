"""Qwen3-VL-MoE (Qwen3-VL-30B-A3B / 235B-A22B): what differs from dense Qwen3-VL is the sparse language model.
The round trip, the video time axis and a trainer step run for it with every registered family
(tests/models/test_tiny_adapters.py, tests/trainer/test_trainer_loop.py); here: the tiny checkpoint really routes,
full fine-tuning reaches exactly the routed experts, and LoRA adapts the attention projections only."""
import torch

from mmgrpo.vlm.models.adapters import LoraSpec, detect_family, load_policy
from mmgrpo.vlm.models.inputs import build_prompt_item
from mmgrpo.vlm.models.tiny import synthetic_image

MSGS = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]}]


def _routes(model):
    """Per language layer, the experts its router picks for each token of the next forward (hooks on the routers)."""
    picked, hooks = [], []
    for layer in model.model.language_model.layers:
        hooks.append(layer.mlp.gate.register_forward_hook(lambda mod, args, out: picked.append(out[2])))
    return picked, hooks


def test_the_tiny_checkpoint_is_a_routed_moe(tiny_dirs):
    path = tiny_dirs("qwen3_vl_moe")
    assert detect_family(path) == "qwen3_vl_moe"
    pol = load_policy(path)
    text = pol.model.config.text_config
    assert (text.num_experts, text.num_experts_per_tok, text.mlp_only_layers) == (4, 2, [])  # every layer sparse
    picked, hooks = _routes(pol.model)
    item = build_prompt_item(pol.processor, pol.adapter, MSGS, images=[synthetic_image(0)])
    with torch.no_grad():
        pol.model(**item)
    assert len(picked) == text.num_hidden_layers
    for experts in picked:  # top-2 of 4 per token, and the router spreads the image + text tokens over all of them
        assert experts.shape == (item["input_ids"].shape[1], 2)
        assert torch.bincount(experts.flatten(), minlength=4).min() > 0


def test_full_fine_tuning_reaches_exactly_the_routed_experts(tiny_dirs):
    """One text token: each layer routes it to 2 of its 4 experts; the gradient of a log-prob reaches those two
    experts' fused weights and no other (the expected set read from the routers, not from the gradient)."""
    pol = load_policy(tiny_dirs("qwen3_vl_moe"), freeze_vision=True)
    picked, hooks = _routes(pol.model)
    ids = torch.tensor([[pol.tokenizer.convert_tokens_to_ids("<|im_start|>")]])
    logp = torch.log_softmax(pol.model(input_ids=ids).logits[0, -1], -1)[7]
    logp.backward()
    for layer, experts in zip(pol.model.model.language_model.layers, picked):
        routed = set(experts.flatten().tolist())
        assert len(routed) == 2
        for name in ("gate_up_proj", "down_proj"):
            grad = getattr(layer.mlp.experts, name).grad
            reached = {e for e in range(4) if grad[e].abs().sum() > 0}
            assert reached == routed, (name, reached, routed)
        assert layer.mlp.gate.weight.grad.abs().sum() > 0  # the router is trained too
    assert not any(p.requires_grad for n, p in pol.model.named_parameters() if ".visual." in n)


def test_lora_adapts_the_attention_projections_only(tiny_dirs):
    """The fused experts are 3-D parameters, not Linear layers: the LLM LoRA targets match q/k/v/o only, and the
    experts, routers and vision tower stay frozen."""
    pol = load_policy(tiny_dirs("qwen3_vl_moe"), lora=LoraSpec(r=4, alpha=8))
    trainable = [n for n, p in pol.model.named_parameters() if p.requires_grad]
    layers = pol.model.config.text_config.num_hidden_layers
    assert len(trainable) == layers * 4 * 2  # (q, k, v, o) x (lora_A, lora_B) per layer
    assert all(".language_model." in n and ".self_attn." in n and ".lora_" in n for n in trainable)
