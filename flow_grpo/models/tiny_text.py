"""Hub-free tiny text encoders and tokenizers of the 2026 generators (random weights, real classes), built offline.

No installed package ships these models' vocabularies (Mistral's Tekken, Qwen's BPE is only in ``dashscope``,
Gemma's SentencePiece model), so each tokenizer is the release's tokenizer *class* around a tiny byte-level BPE
trained on a fixed corpus, with the release's special tokens and a chat template of the release's structure:

* Qwen3 (FLUX.2-klein, Z-Image): the VLM front-end's tiny Qwen2 tokenizer (``Qwen2TokenizerFast``, Qwen's special
  tokens) with a Qwen3 ChatML template that honours ``enable_thinking`` (``False`` appends an empty
  ``<think>\\n\\n</think>\\n\\n`` block after the generation prompt, as Qwen3's template does).
* Mistral-3 (FLUX.2-dev): a ``LlamaTokenizerFast`` (``<s>``, ``</s>``, ``[INST]``, ``[SYSTEM_PROMPT]``, image tokens)
  inside a ``PixtralProcessor`` (the release's ``AutoProcessor``), template
  ``<s>[SYSTEM_PROMPT]...[/SYSTEM_PROMPT][INST]...[/INST]``.

Text models are narrow (hidden 16) but as deep as the layers the pipelines read (FLUX.2 stacks hidden states 10,
20, 30 of Mistral-3 and 9, 18, 27 of Qwen3), so the release's layer indices run unchanged.
"""
from __future__ import annotations

from typing import Optional

from .tiny_tokenizers import _CORPUS

QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for c in message['content'] -%}{%- if 'text' in c -%}{{- c['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)

MISTRAL_SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                          "[IMG]", "[IMG_BREAK]", "[IMG_END]", "<pad>"]
MISTRAL_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for m in messages -%}"
    "{%- if m['content'] is string -%}{%- set text = m['content'] -%}"
    "{%- else -%}{%- set text = m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('')"
    " -%}{%- endif -%}"
    "{%- if m['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' -}}"
    "{%- elif m['role'] == 'user' -%}{{- '[INST]' + text + '[/INST]' -}}"
    "{%- else -%}{{- text + eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)


def qwen3_tokenizer():
    """``Qwen2TokenizerFast`` (Qwen3's class) with the Qwen3 chat template above."""
    from mmgrpo.vlm.models.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok


def tiny_qwen3(tok, num_layers: int, hidden: int = 16, causal_lm: bool = True):
    """A ``Qwen3ForCausalLM`` (FLUX.2-klein) or ``Qwen3Model`` (``causal_lm=False``) of ``num_layers`` narrow layers."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

    cfg = Qwen3Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                      max_position_embeddings=2048, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      tie_word_embeddings=False)
    return (Qwen3ForCausalLM if causal_lm else Qwen3Model)(cfg)


def _byte_bpe(special_tokens: list[str], vocab_size: int = 400):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE(unk_token=special_tokens[0]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(list(_CORPUS) * 3, trainer=trainer)
    return tk


def mistral3_processor():
    """A ``PixtralProcessor`` (FLUX.2-dev's ``AutoProcessor``) around a tiny ``LlamaTokenizerFast``."""
    from transformers import LlamaTokenizerFast, PixtralImageProcessor, PixtralProcessor

    tok = LlamaTokenizerFast(tokenizer_object=_byte_bpe(MISTRAL_SPECIAL_TOKENS), bos_token="<s>", eos_token="</s>",
                             unk_token="<unk>", pad_token="<pad>")
    ip = PixtralImageProcessor(size={"longest_edge": 64}, patch_size=16)
    return PixtralProcessor(image_processor=ip, tokenizer=tok, patch_size=16, spatial_merge_size=1,
                            chat_template=MISTRAL_CHAT_TEMPLATE)


def tiny_mistral3(tok, num_layers: int = 31, hidden: int = 16):
    """``Mistral3ForConditionalGeneration`` (Mistral-Small-3.x's class): a narrow Mistral text model of
    ``num_layers`` layers and a one-layer Pixtral vision tower (never used for text-only prompts)."""
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration

    cfg = Mistral3Config(
        text_config=dict(model_type="mistral", vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=num_layers, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         max_position_embeddings=2048, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id),
        vision_config=dict(model_type="pixtral", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                           num_attention_heads=2, head_dim=8, image_size=64, patch_size=16),
        image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=1, vision_feature_layer=-1,
        multimodal_projector_bias=False)
    return Mistral3ForConditionalGeneration(cfg)


def tiny_qwen3_vl(seed: int = 0):
    """(``Qwen3VLForConditionalGeneration``, ``Qwen3VLProcessor``): the VLM front-end's tiny Qwen3-VL (hidden 64)."""
    from mmgrpo.vlm.models.tiny import build_tiny_model

    return build_tiny_model("qwen3_vl", seed=seed)


def _tiny_vae(scale_factor_8: bool = True, shift_factor: Optional[float] = None):
    from diffusers import AutoencoderKL

    # 4 blocks -> VAE scale factor 8 (like the real models); 64 px images -> 8x8 latents.
    return AutoencoderKL(
        down_block_types=["DownEncoderBlock2D"] * 4, up_block_types=["UpDecoderBlock2D"] * 4,
        block_out_channels=[8, 16, 16, 16], layers_per_block=1, latent_channels=4, norm_num_groups=8,
        sample_size=64, scaling_factor=1.5305 if shift_factor is not None and shift_factor < 0.1 else 0.3611,
        shift_factor=shift_factor, use_quant_conv=False, use_post_quant_conv=False,
    )
