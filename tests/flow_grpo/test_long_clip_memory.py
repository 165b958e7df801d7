"""Memory settings for long clips (issue 39 item 3) on the tiny Wan2.1 / Wan2.2 A14B: the VAE decoded one sample at a
time (``model.vae_slicing``) gives the batched decode's frames within one uint8 level; ``model.vae_tiling`` switches
the VAE's tiled decode on (its frames differ where tiles blend: diffusers guarantees no equality, docs/scaling.md);
activation checkpointing per transformer block leaves the velocity and the LoRA gradients unchanged."""
from types import SimpleNamespace

import pytest
import torch

from flow_grpo.build import set_vae_memory
from flow_grpo.sde import sde_step

from .conftest import tiny_adapter

H = 32


def _opts(slicing=False, tiling=False):
    return SimpleNamespace(vae_slicing=slicing, vae_tiling=tiling)


def test_sliced_decode_equals_the_batched_decode():
    ad = tiny_adapter("wan", num_frames=5, max_sequence_length=16)
    ad.set_resolution(H, H)
    x = ad.initial_noise([1, 2, 3], H, H)
    ref = ad.decode(x, H, H)
    calls = []
    orig = ad.vae._decode
    ad.vae._decode = lambda z, *a, **k: calls.append(z.shape[0]) or orig(z, *a, **k)
    set_vae_memory(ad, _opts(slicing=True))
    out = ad.decode(x, H, H)
    assert calls == [1, 1, 1] and out.shape == ref.shape == (3, 5, H, H, 3)
    assert int((out.int() - ref.int()).abs().max()) <= 1  # per-sample vs batched convolutions: float rounding
    set_vae_memory(ad, _opts(tiling=True))
    assert ad.vae.use_tiling


def test_vae_options_name_a_vae_without_them():
    ad = SimpleNamespace(vae=torch.nn.Identity(), kind="x")
    with pytest.raises(ValueError, match="model.vae_tiling=true.*has no enable_tiling"):
        set_vae_memory(ad, _opts(tiling=True))


@pytest.mark.parametrize("kind,sigmas", [("wan", [(0.9, 0.7)]), ("wan22", [(0.95, 0.8), (0.5, 0.3)])])
def test_activation_checkpointing_keeps_velocity_and_gradients(kind, sigmas):
    ad = tiny_adapter(kind, num_frames=5, max_sequence_length=16)
    torch.manual_seed(3)
    ad.add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for n, p in ad.transformer.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    ad.set_resolution(H, H)
    emb = ad.encode_prompts(["a cat", "a cat"])
    x = ad.initial_noise([1, 2], H, H)
    params = [p for p in ad.transformer.parameters() if p.requires_grad]

    def run():
        ad.transformer.train()
        loss, vs = 0.0, []
        for s, s_next in sigmas:
            v = ad.predict_velocity(x, s, emb, 5.0, True)
            noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(7))
            lp = sde_step(v, x, s, s_next, kind="flow", prev_sample=x + 0.1 * noise).log_prob
            loss = loss + lp.sum()
            vs.append(v.detach())
        for p in params:
            p.grad = None
        loss.backward()
        return vs, [p.grad.clone() for p in params]

    v0, g0 = run()
    ad.set_gradient_checkpointing(True)
    assert all(getattr(e, "gradient_checkpointing", False) for e in getattr(ad, "experts", {"": ad.transformer}).values())
    v1, g1 = run()
    assert all(torch.equal(a, b) for a, b in zip(v0, v1))
    scale = max(float(g.abs().max()) for g in g0)
    assert scale > 1e-3
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-6 * scale)


def test_text_encoders_go_to_the_device_only_for_new_prompts():
    """On this CPU-only machine host and device are both the CPU: the test checks the moves (spied) and that the
    embeddings are those of an adapter without offload; the memory saving itself needs a GPU (not run)."""
    from flow_grpo.build import set_text_encoder_offload

    ad = tiny_adapter("wan", num_frames=5, max_sequence_length=16)
    ref = tiny_adapter("wan", num_frames=5, max_sequence_length=16).encode_prompts(["a cat", "a dog"])
    moves = []
    enc = ad.pipe.text_encoder
    orig = enc.to
    # the adapter's device object (a move there) or the host string (a move back)
    enc.to = lambda *a, **k: moves.append("device" if a[0] is ad.device else a[0]) or orig(*a, **k)
    set_text_encoder_offload(ad, True, host="cpu")
    assert moves == ["cpu"]
    moves.clear()
    out = ad.encode_prompts(["a cat", "a dog"])
    assert moves == ["device", "cpu"]
    moves.clear()
    again = ad.encode_prompts(["a dog"])  # cached: the encoder stays where it is
    assert moves == []
    torch.testing.assert_close(out.prompt_embeds, ref.prompt_embeds, rtol=0, atol=0)
    torch.testing.assert_close(again.prompt_embeds, ref.prompt_embeds[1:], rtol=0, atol=0)
