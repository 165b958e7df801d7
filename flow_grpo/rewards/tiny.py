"""Tiny random reward models laid out like the released ones, for rehearsing a run without downloaded weights
(``flow_grpo make-tiny-reward DIR pickscore``). Random weights score nothing meaningful; they exercise the loading,
preprocessing and scoring paths and the wire format of the reward server."""
from __future__ import annotations

from pathlib import Path

__all__ = ["save_tiny_pickscore", "TINY_REWARDS"]


def save_tiny_pickscore(directory: str, seed: int = 0, image_size: int = 32) -> dict[str, str]:
    """A tiny random PickScore in the release's two-folder layout: ``<directory>/processor`` (what
    ``laion/CLIP-ViT-H-14-laion2B-s32B-b79K`` holds: the CLIP BPE tokenizer, 49,408 entries, and a PIL CLIP image
    processor; resize + centre crop to ``image_size`` instead of 224) and ``<directory>/model`` (what
    ``yuvalkirstain/PickScore_v1`` holds: a ``CLIPModel`` config + safetensors, 2 layers of width 32).

    Returns the reward kwargs: ``{"model_path": ..., "processor_path": ...}``."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    from .clip import hf_clip_tokenizer_from_open_clip

    root = Path(directory)
    proc_dir, model_dir = root / "processor", root / "model"
    hf_clip_tokenizer_from_open_clip().save_pretrained(proc_dir)
    CLIPImageProcessorPil(size={"shortest_edge": image_size},
                          crop_size={"height": image_size, "width": image_size}).save_pretrained(proc_dir)
    torch.manual_seed(seed)
    cfg = CLIPConfig(
        text_config=dict(vocab_size=49408, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=77, projection_dim=16),
        vision_config=dict(image_size=image_size, patch_size=8, hidden_size=32, intermediate_size=64,
                           num_hidden_layers=2, num_attention_heads=2, projection_dim=16),
        projection_dim=16)
    CLIPModel(cfg).eval().save_pretrained(model_dir)
    return {"model_path": str(model_dir), "processor_path": str(proc_dir)}


TINY_REWARDS = {"pickscore": save_tiny_pickscore}
