"""Hub-free tiny SANA pipeline (random weights) for CPU tests and smoke runs.

* Text: a narrow ``Gemma2Model`` (SANA's encoder class; the release: Gemma-2-2B-it) and a ``GemmaTokenizer`` over a
  tiny BPE vocabulary (Gemma's special-token ids, normaliser and ``<bos>``; see :func:`gemma_tokenizer`). The pipeline's complex
  human instruction is tokenised by it too (~1.3k tokens here), so the text model's positions go to 4096.
* VAE: ``AutoencoderDC`` with the release's 32x compression (six stages) but 8 channels per stage, no attention,
  a 4-channel latent and SANA's scaling factor 0.41407.
* Transformer: ``SanaTransformer2DModel`` with patch 1, 2 layers, 2 heads of 8, cross-attention width 16.
* Scheduler: ``FlowMatchEulerDiscreteScheduler(shift=3.0)`` (so ``__call__`` is the Euler ODE the adapter's loop
  reproduces; the releases' DPM-Solver with flow sigmas gives the same kind of grid).

At 128 x 128 px the latent is (4, 4, 4): 16 tokens.
"""
from __future__ import annotations

GEMMA_SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # Gemma's ids 0-4


def gemma_tokenizer(vocab_size: int = 400):
    """A ``GemmaTokenizer`` built from a vocabulary and merges (as a saved one is reloaded: the class sets Gemma's
    normaliser, " " -> "▁", and pre-tokeniser itself), trained here on the tiny corpus with that normaliser and
    the printable ASCII characters as the initial alphabet (other characters: ``<unk>``; the release has byte
    fallback pieces)."""
    import json
    import string

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    from .tiny_tokenizers import _CORPUS

    tk = Tokenizer(models.BPE(unk_token="<unk>"))
    # pieces within words (SentencePiece's BPE never merges across the word-start marker)
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    alphabet = sorted(set(string.printable.strip()) | {"▁"})
    tk.train_from_iterator(list(_CORPUS) * 3, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=GEMMA_SPECIAL_TOKENS, initial_alphabet=alphabet, show_progress=False))
    model = json.loads(tk.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return GemmaTokenizer(vocab=model["vocab"], merges=merges, add_bos_token=True, add_eos_token=False)


def build_tiny_sana_pipeline(seed: int = 0):
    import torch
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model

    torch.manual_seed(seed)
    tok = gemma_tokenizer()
    te = Gemma2Model(Gemma2Config(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, max_position_embeddings=4096, pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id))
    vae = AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=8, encoder_block_types="ResBlock",
                        decoder_block_types="ResBlock", encoder_block_out_channels=(8,) * 6,
                        decoder_block_out_channels=(8,) * 6, encoder_layers_per_block=(1,) * 6,
                        decoder_layers_per_block=(1,) * 6, encoder_qkv_multiscales=((),) * 6,
                        decoder_qkv_multiscales=((),) * 6, scaling_factor=0.41407)
    transformer = SanaTransformer2DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=16,
        sample_size=4, patch_size=1)
    pipe = SanaPipeline(tokenizer=tok, text_encoder=te, vae=vae, transformer=transformer,
                        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))
    pipe.set_progress_bar_config(disable=True)
    return pipe
