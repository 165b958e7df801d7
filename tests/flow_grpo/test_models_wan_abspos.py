"""flow_grpo/models/wan_abspos.py: the sin-cos tables by hand, the same weights as Wan's transformer, the
embedding added to the patch tokens, a pipeline-folder round trip through load_adapter, and the reason the class
exists (Wan alone maps a spatially uniform input to a spatially uniform output; with the embedding it does not)."""
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")


def _config():
    return dict(patch_size=(1, 4, 4), num_attention_heads=2, attention_head_dim=8, in_channels=3, out_channels=3,
                text_dim=8, freq_dim=8, ffn_dim=32, num_layers=1, rope_max_seq_len=32)


def test_sincos_tables_by_hand():
    from flow_grpo.models.wan_abspos import sincos_1d, sincos_3d

    t = sincos_1d(3, 4)  # w = [1, 10000 ** -0.5 = 0.01]
    for p in range(3):
        assert t[p].tolist() == pytest.approx([math.sin(p), math.sin(0.01 * p), math.cos(p), math.cos(0.01 * p)])
    with pytest.raises(ValueError):
        sincos_1d(3, 5)
    pe = sincos_3d(2, 3, 4, 16)  # channels: frame 4 (16 // 8 * 2), row 6 ((16 - 4) // 4 * 2), column 6
    assert pe.shape == (16, 2, 3, 4) and pe.dtype == torch.float32
    f, h, w = 1, 2, 3
    assert pe[:4, f, h, w].tolist() == pytest.approx(sincos_1d(2, 4)[f].tolist())
    assert pe[4:10, f, h, w].tolist() == pytest.approx(sincos_1d(3, 6)[h].tolist())
    assert pe[10:, f, h, w].tolist() == pytest.approx(sincos_1d(4, 6)[w].tolist())
    assert pe[4:10, 0, h, 0].tolist() == pe[4:10, 1, h, 3].tolist()  # the row part ignores frame and column


def test_same_weights_and_embedding_added_to_patch_tokens():
    from diffusers import WanTransformer3DModel

    from flow_grpo.models.wan_abspos import WanAbsPosTransformer3DModel, sincos_3d

    torch.manual_seed(0)
    stock = WanTransformer3DModel(**_config())
    ours = WanAbsPosTransformer3DModel(**_config())
    sd = stock.state_dict()
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in sd.items()}
    ours.load_state_dict(sd)
    x = torch.randn(2, 3, 3, 8, 8)
    conv = torch.nn.functional.conv3d(x, sd["patch_embedding.weight"], sd["patch_embedding.bias"], stride=(1, 4, 4))
    torch.testing.assert_close(ours.patch_embedding(x), conv + sincos_3d(3, 2, 2, 16)[None])
    torch.testing.assert_close(stock.patch_embedding(x), conv)


def test_uniform_input_stays_uniform_only_without_the_embedding():
    """Why the class exists: Wan's tokens see positions only through RoPE offsets, so identical tokens give
    identical outputs at every (frame, row, column); the absolute embedding breaks that symmetry."""
    from diffusers import WanTransformer3DModel

    from flow_grpo.models.wan_abspos import WanAbsPosTransformer3DModel

    torch.manual_seed(1)
    stock = WanTransformer3DModel(**_config()).eval()
    ours = WanAbsPosTransformer3DModel(**_config()).eval()
    ours.load_state_dict(stock.state_dict())
    with torch.no_grad():
        for m in (stock, ours):  # a non-zero output projection (the builder zero-inits it)
            torch.nn.init.normal_(m.proj_out.weight, std=0.5)
        ours.proj_out.load_state_dict(stock.proj_out.state_dict())
        x = torch.full((1, 3, 3, 8, 8), 0.3)
        text = torch.randn(1, 4, 8)
        t = torch.tensor([500.0])
        y0 = stock(x, t, text, return_dict=False)[0]  # (1, 3, F, H, W)
        y1 = ours(x, t, text, return_dict=False)[0]
    # patch 4: compare each 4x4 patch's output with the first one (same pixel inside the patch)
    p0 = y0.unfold(3, 4, 4).unfold(4, 4, 4)  # (1, 3, F, 2, 2, 4, 4)
    p1 = y1.unfold(3, 4, 4).unfold(4, 4, 4)
    ref0 = p0[:, :, :1, :1, :1]
    assert (p0 - ref0).abs().max() < 1e-5 * ref0.abs().max().clamp_min(1.0)
    assert (p1 - p1[:, :, :1, :1, :1]).abs().max() > 1e-2


def test_folder_round_trip_through_load_adapter(tmp_path):
    import importlib.util
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("build_tiny_t2v", root / "scripts" / "build_tiny_t2v.py")
    b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(b)
    pipe = b.build_pipeline(0, 16, 2, 1, 8, zero_init=False, abs_pos=True)
    pipe.save_pretrained(str(tmp_path))
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["transformer"] == ["flow_grpo.models.wan_abspos", "WanAbsPosTransformer3DModel"]
    from diffusers import WanTransformer3DModel

    from flow_grpo.models import load_adapter

    ad = load_adapter(str(tmp_path), max_sequence_length=b.DEMO_MAX_SEQUENCE_LENGTH, num_frames=5)
    assert type(ad.transformer).__name__ == "WanAbsPosTransformer3DModel"
    x = torch.randn(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(0))
    emb = ad.encode_prompts(["a red circle moves up"])
    with torch.no_grad():
        v_loaded = ad.predict_velocity(x, torch.tensor([0.7]), emb, cfg=False)
        ref = pipe.transformer.eval()
        v_built = ref(x, torch.tensor([700.0]), emb.prompt_embeds, return_dict=False)[0]
        stock = WanTransformer3DModel.from_pretrained(str(tmp_path / "transformer")).eval()
        v_stock = stock(x, torch.tensor([700.0]), emb.prompt_embeds, return_dict=False)[0]
    torch.testing.assert_close(v_loaded, v_built, atol=1e-5, rtol=1e-5)
    assert (v_stock - v_built).abs().max() > 1e-3  # the same weights without the embedding: another model
