"""Image rewards for the diffusion front-end (typed interface; contract in :mod:`flow_grpo.rewards.base`).

Light to import (numpy only): torch, open_clip, transformers and rapidocr load when a reward is built or called.

    from flow_grpo.rewards import build_reward, available_rewards, MultiReward
    r = build_reward("jpeg_compressibility")
    out = r(images, prompts, metadata)      # {"jpeg_compressibility": (N,) float32 CPU tensor}
    out = r.evaluate(images, prompts)       # same, as numpy arrays (no torch import)

Registered names (``build_reward(name, **kwargs)``; any ``"package.module:factory"`` works too):

===================================  ==========================================================================
``jpeg_compressibility``             ``-size_kB / scale`` of the JPEG (quality 95), DDPO     (:mod:`.compression`)
``jpeg_incompressibility``           ``+size_kB / scale``                                    (:mod:`.compression`)
``brightness``                       ``mean(x) / 255``                                       (:mod:`.toy`)
``color_target``                     ``1 - mean ||x - c|| / (255 sqrt 3)``                   (:mod:`.toy`)
``clip_score``                       ``scale * max(cos(E_I, E_T(prefix + p)), clamp_min)``   (:mod:`.clip`)
``clipscore_hessel``                 Hessel's CLIPScore ``2.5 max(cos, 0)``, "A photo depicts " (:mod:`.clip`)
``aesthetic``                        LAION MLP on normalised CLIP image features             (:mod:`.clip`)
``clip_preference``                  ``scale * [exp(logit_scale)] * cos``, HF CLIPModel      (:mod:`.clip`)
``pickscore``                        ``exp(logit_scale) cos / 26``; CLIP-H processor + model (:mod:`.clip`)
``hps``                              raw cosine of a HF CLIPModel (not the HPSv2 weights)    (:mod:`.clip`)
``hpsv2``                            HPSv2/2.1: cos of open_clip ViT-H-14 + HPS checkpoint   (:mod:`.hps`)
``imagereward``                      ``(MLP(BLIP(x, p)[CLS]) - mean) / std``                 (:mod:`.imagereward`)
``vlm_judge``                        Qwen-VL judge: p(Yes)/(p(Yes)+p(No)) or rating 1..K     (:mod:`.vlm_judge`)
``vlm_judge_pairwise``               Pref-GRPO win rate from the Qwen-VL pairwise judge      (:mod:`.vlm_judge`)
``unified_reward_point``             UnifiedReward pointwise: generated ``Final Score`` / ACS  (:mod:`.unified_reward`)
``unified_reward_think_pairwise``    Pref-GRPO win rate, UnifiedReward-Think verdicts  (:mod:`.unified_reward`)
``videoalign``                       VideoReward VQ / MQ / TA, per-dimension weights        (:mod:`.videoalign`)
``ocr``                              ``1 - Lev(ocr, target) / max len``, rapidocr             (:mod:`.ocr`)
``remote``                           HTTP client of ``python -m flow_grpo.rewards.server``    (:mod:`.remote`)
``mini_geneval``                     verifiable Mini-GenEval (strict / partial)              (:mod:`.mini_geneval`)
``blob_count``                       ``1 - |n_blobs - k| / k``: hackable proxy of the count  (:mod:`.proxies`)
``motion_verifier``                  verifiable Mini-T2V over videos (strict / partial)      (:mod:`.motion`)
``vlm_judge_video``                  Qwen-VL judge over videos, fps through the video contract (:mod:`.vlm_judge_video`)
``geneval_official``                 GenEval's own scorer (mmdet), for the remote server     (:mod:`.geneval_official`)
``video_per_frame``                  an image reward per frame, mean or min over time        (:mod:`.video`)
``temporal_consistency``             ``1 - mean_f mean|x_f - x_{f-1}| / 255`` over a video    (:mod:`.video`)
``dino_similarity``                  ``max_j cos(DINO_cls(x), DINO_cls(ref_j))``, references   (:mod:`.dino`)
``adv_dino``                         Adv-GRPO's adversarial DINO head (trained in the loop)   (:mod:`.dino`)
===================================  ==========================================================================

Combinators: :class:`MultiReward` (weighted sum or per-reward for GDPO), :class:`PairwisePreferenceReward`
(Pref-GRPO win rate) with :class:`ScoreComparator`, :class:`AsyncRewardRunner` (futures).
"""
from .base import (
    FunctionReward,
    MultiReward,
    PairwisePreferenceReward,
    PairwiseScorer,
    Reward,
    RewardError,
    RewardFn,
    ScoreComparator,
    available_rewards,
    build_reward,
    check_finite,
    check_reward_settings,
    normalize_metadata,
    register_reward,
    win_rate,
)

__all__ = [
    "FunctionReward",
    "MultiReward",
    "PairwisePreferenceReward",
    "PairwiseScorer",
    "Reward",
    "RewardError",
    "RewardFn",
    "ScoreComparator",
    "available_rewards",
    "build_reward",
    "check_finite",
    "check_reward_settings",
    "normalize_metadata",
    "register_reward",
    "win_rate",
    "AsyncRewardRunner",
]


def __getattr__(name: str):  # lazy: the runner pulls in concurrent.futures only when used
    if name == "AsyncRewardRunner":
        from .async_runner import AsyncRewardRunner

        return AsyncRewardRunner
    raise AttributeError(name)
