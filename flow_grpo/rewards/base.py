"""Typed reward interface for the diffusion front-end.

Contract
--------
A reward is a callable::

    reward(images, prompts, metadata=None, **kwargs) -> dict[str, torch.Tensor]

* ``images``: a batch of N RGB images in one of these layouts (converted once by :func:`flow_grpo.media.to_uint8_nhwc`):
    - uint8 NHWC, ``torch.Tensor`` or ``numpy.ndarray`` of shape (N, H, W, 3) (C=1 is broadcast to 3);
    - float NCHW in [0, 1], ``torch.Tensor`` or ``numpy.ndarray`` of shape (N, 3, H, W)
      (a VAE decode that is still in [-1, 1] is rejected, not silently clipped);
    - a list of N ``PIL.Image.Image`` of equal size (any mode; converted to RGB).
* ``prompts``: N strings.  ``metadata``: None or N mappings (GenEval-style per-sample dicts).
* Returns a dict of CPU float32 tensors of shape (N,):
    - key ``<name>`` is the reward the trainer optimises;
    - keys ``<name>/<aux>`` are per-sample diagnostics (logged, never optimised);
    - key ``"valid"`` (bool, (N,)) is present only when ``nan_policy="drop"`` (see below).
  :meth:`Reward.evaluate` returns the same dict as numpy arrays (numpy-only rewards then never import torch).

Non-finite scores
-----------------
Every output of :meth:`Reward.__call__` is checked.  With ``nan_policy="raise"`` (default) a NaN/inf raises
:class:`RewardError` naming the reward, the key and the sample indices.  With ``nan_policy="drop"`` the scores
are returned unchanged (non-finite entries stay non-finite, so they can never pass for a real score) together
with ``out["valid"]``: True where *every* key of that sample is finite.  The trainer must then exclude invalid
samples, e.g. ``group_advantages(r[valid], gid[valid])`` and a zero loss mask for the rest.

Aggregation
-----------
:class:`MultiReward` runs several rewards and returns every component plus ``"total" = sum_k w_k r_k``.
In ``mode="weighted_sum"`` the trainer normalises ``total`` per group.  In ``mode="per_reward"`` normalisation
is left to the core: the trainer calls ``mmgrpo.core.multi_reward_advantages({k: out[k]}, weights,
mode="normalize_then_sum")`` (GDPO: z-score each reward in its group, then sum with weights);
``"total"`` is still returned for logging.

Pairwise preference (Pref-GRPO)
-------------------------------
:class:`PairwisePreferenceReward` wraps a pairwise scorer and returns per-sample win rates inside each group:
``r_i = 1/(G-1) * sum_{j != i, g(j) = g(i)} w_ij`` with ``w_ij = 1[i > j]``, ties ``0.5``.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, Union

import numpy as np

from ..media import ImageBatch, to_uint8_media

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

Metadata = Union[Sequence[Mapping[str, Any]], None]
RewardOutput = dict  # dict[str, torch.Tensor]
NanPolicy = Literal["raise", "drop"]

__all__ = [
    "check_reward_settings",
    "RewardError",
    "Reward",
    "RewardFn",
    "FunctionReward",
    "MultiReward",
    "PairwisePreferenceReward",
    "PairwiseScorer",
    "ScoreComparator",
    "normalize_metadata",
    "win_rate",
    "register_reward",
    "build_reward",
    "available_rewards",
    "check_finite",
    "check_finite_numpy",
    "check_shapes",
]


class RewardError(RuntimeError):
    """A reward produced unusable output (non-finite, wrong shape) or could not be computed.

    Attributes: ``reward`` (name), ``indices`` (offending sample indices, possibly empty), ``key``.
    """

    def __init__(self, message: str, reward: str = "?", indices: Sequence[int] = (), key: str | None = None):
        super().__init__(message)
        self.reward = reward
        self.indices = list(indices)
        self.key = key


class RewardFn(Protocol):
    """Structural type of every reward: ``(images, prompts, metadata) -> {name: (N,) float32}``."""

    def __call__(self, images: ImageBatch, prompts: Sequence[str], metadata: Metadata = None,
                 **kwargs: Any) -> RewardOutput: ...


def normalize_metadata(metadata: Metadata, n: int, reward: str = "?") -> list[Mapping[str, Any]]:
    """Return ``metadata`` as a list of N mappings (``None`` -> N empty dicts)."""
    if metadata is None:
        return [{} for _ in range(n)]
    if isinstance(metadata, Mapping):
        raise TypeError(f"reward {reward!r}: metadata must be a sequence of N per-sample dicts, got one dict")
    md = list(metadata)
    if len(md) != n:
        raise ValueError(f"reward {reward!r}: got {len(md)} metadata entries for {n} images")
    for i, m in enumerate(md):
        if m is None:
            md[i] = {}
        elif not isinstance(m, Mapping):
            raise TypeError(f"reward {reward!r}: metadata[{i}] must be a dict, got {type(m)!r}")
    return md


# ----------------------------------------------------------------------------------------------------------
# output checking
# ----------------------------------------------------------------------------------------------------------
def _as_scores(value: Any, n: int, reward: str, key: str) -> np.ndarray:
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor (any dtype/device)
        value = value.detach().float().cpu().numpy()
    try:
        a = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise RewardError(f"reward {reward!r}: output {key!r} is not numeric ({e})", reward, key=key) from e
    if a.ndim == 2 and a.shape[1] == 1:
        a = a[:, 0]
    if a.shape != (n,):
        raise RewardError(f"reward {reward!r}: output {key!r} has shape {a.shape}, expected ({n},)",
                          reward, key=key)
    return np.ascontiguousarray(a.astype(np.float32))


def check_shapes(out: Any, n: int, reward: str) -> None:
    """Raise :class:`RewardError` unless ``out`` is a mapping of numeric (N,) scores (plus an optional (N,)
    ``"valid"``): the structural half of :func:`check_finite_numpy`, without the non-finite policy. Lets a caller
    treat a malformed output (e.g. the wrong number of scores) as a failed call before looking at the values."""
    if not isinstance(out, Mapping):
        raise RewardError(f"reward {reward!r}: must return a dict of (N,) scores, got {type(out)!r}", reward)
    for key, value in out.items():
        if key != "valid":
            _as_scores(value, n, reward, key)
            continue
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        if np.asarray(value).reshape(-1).shape != (n,):
            raise RewardError(f"reward {reward!r}: 'valid' has shape {np.shape(value)}, expected ({n},)", reward)


def check_finite_numpy(out: Mapping[str, Any], n: int, reward: str, nan_policy: NanPolicy = "raise"
                       ) -> dict[str, np.ndarray]:
    """Validate a raw reward output and apply ``nan_policy`` (numpy core of :func:`check_finite`).

    Every value becomes a float32 array of shape (N,) (a ``"valid"`` entry stays bool).
    ``nan_policy="raise"``: any non-finite entry raises :class:`RewardError` with reward, key and indices.
    ``nan_policy="drop"``: returns the scores unchanged plus ``"valid"[i] = all_k isfinite(out[k][i])``
    (AND-ed with an incoming ``"valid"``), and logs how many samples were dropped.
    An incoming ``"valid"`` that is not all True is always passed on.
    """
    if nan_policy not in ("raise", "drop"):
        raise ValueError(f"nan_policy must be 'raise' or 'drop', got {nan_policy!r}")
    if not isinstance(out, Mapping):
        raise RewardError(f"reward {reward!r}: must return a dict of (N,) scores, got {type(out)!r}", reward)
    res: dict[str, np.ndarray] = {}
    valid = np.ones(n, dtype=bool)
    finite = np.ones(n, dtype=bool)
    for key, value in out.items():
        if key == "valid":
            if hasattr(value, "detach"):
                value = value.detach().cpu().numpy()
            v = np.asarray(value).reshape(-1).astype(bool)
            if v.shape != (n,):
                raise RewardError(f"reward {reward!r}: 'valid' has shape {v.shape}, expected ({n},)", reward)
            valid &= v
            continue
        a = _as_scores(value, n, reward, key)
        bad = ~np.isfinite(a)
        if bad.any():
            idx = np.nonzero(bad)[0].tolist()
            if nan_policy == "raise":
                raise RewardError(
                    f"reward {reward!r}: non-finite values in {key!r} at sample indices {idx} "
                    f"(values {[float(a[i]) for i in idx[:8]]}); pass nan_policy='drop' to mask them instead",
                    reward, idx, key)
            finite &= ~bad
        res[key] = a
    if nan_policy == "drop":
        n_bad = int((valid & ~finite).sum())  # samples already invalid (e.g. a dropped failed call) are not re-counted
        if n_bad:
            logger.warning("reward %r: %d/%d samples have non-finite scores; marked invalid", reward, n_bad, n)
        valid &= finite
        res["valid"] = valid
    elif not valid.all():
        res["valid"] = valid
    return res


def _to_torch(out: Mapping[str, np.ndarray]) -> RewardOutput:
    import torch

    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


def check_finite(out: Mapping[str, Any], n: int, reward: str, nan_policy: NanPolicy = "raise") -> RewardOutput:
    """:func:`check_finite_numpy`, returning CPU torch tensors (float32 scores, bool ``"valid"``)."""
    return _to_torch(check_finite_numpy(out, n, reward, nan_policy))


# ----------------------------------------------------------------------------------------------------------
# base class
# ----------------------------------------------------------------------------------------------------------
class Reward:
    """Base class: converts inputs once, calls :meth:`score`, validates the output.

    Subclasses implement ``score(images_u8: np.ndarray (N,H,W,3), prompts: list[str], metadata: list[dict],
    **kwargs) -> dict[str, array-like (N,)] | array-like (N,)``; a bare array becomes ``{self.name: array}``.
    """

    name: str = "reward"
    # True: ``images`` may also be a video batch, given to ``score`` as uint8 (B, F, H, W, 3) (flow_grpo.media)
    accepts_video: bool = False
    # True: videos only (motion verifier, video judges); an image batch is refused by ``evaluate``
    video_only: bool = False

    def __init__(self, name: str | None = None, nan_policy: NanPolicy = "raise"):
        if name is not None:
            self.name = name
        if nan_policy not in ("raise", "drop"):
            raise ValueError(f"nan_policy must be 'raise' or 'drop', got {nan_policy!r}")
        self.nan_policy: NanPolicy = nan_policy

    def score(self, images: np.ndarray, prompts: list[str], metadata: list[Mapping[str, Any]],
              **kwargs: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, images: ImageBatch, prompts: Sequence[str], metadata: Metadata = None,
                 **kwargs: Any) -> RewardOutput:
        return _to_torch(self.evaluate(images, prompts, metadata, **kwargs))

    def evaluate(self, images: ImageBatch, prompts: Sequence[str], metadata: Metadata = None,
                 **kwargs: Any) -> dict[str, np.ndarray]:
        """Same as calling the reward, but returns numpy arrays (float32 scores, bool ``valid``).

        Lets numpy-only rewards run without importing torch (e.g. in the reward server).
        """
        imgs = to_uint8_media(images, self.accepts_video, self.video_only, f"reward {self.name!r}: videos")
        n = imgs.shape[0]
        return self._evaluate(imgs, _check_prompts(prompts, n, self.name),
                              normalize_metadata(metadata, n, self.name), **kwargs)

    def _evaluate(self, imgs: np.ndarray, prompts: list[str], md: list[Mapping[str, Any]],
                  **kwargs: Any) -> dict[str, np.ndarray]:
        raw = self.score(imgs, prompts, md, **kwargs)
        if not isinstance(raw, Mapping):
            raw = {self.name: raw}
        return check_finite_numpy(raw, imgs.shape[0], self.name, self.nan_policy)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _check_prompts(prompts: Sequence[str], n: int, reward: str) -> list[str]:
    if isinstance(prompts, str):
        raise TypeError(f"reward {reward!r}: prompts must be a sequence of N strings, got one string")
    p = list(prompts)
    if len(p) != n:
        raise ValueError(f"reward {reward!r}: got {len(p)} prompts for {n} images")
    for i, s in enumerate(p):
        if not isinstance(s, str):
            raise TypeError(f"reward {reward!r}: prompts[{i}] must be str, got {type(s)!r}")
    return p


class FunctionReward(Reward):
    """Adapt a plain function ``fn(images_u8 (N,H,W,3), prompts, metadata) -> (N,) | dict`` to a :class:`Reward`."""

    def __init__(self, fn: Callable[..., Any], name: str, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        self.fn = fn

    def score(self, images, prompts, metadata, **kwargs):
        return self.fn(images, prompts, metadata, **kwargs)


# ----------------------------------------------------------------------------------------------------------
# registry
# ----------------------------------------------------------------------------------------------------------
# Built-ins are registered as "module:attr" strings so that listing rewards never imports torch/open_clip.
_REGISTRY: dict[str, Callable[..., Any] | str] = {
    "jpeg_compressibility": "flow_grpo.rewards.compression:JpegCompressibility",
    "jpeg_incompressibility": "flow_grpo.rewards.compression:JpegIncompressibility",
    "brightness": "flow_grpo.rewards.toy:Brightness",
    "color_target": "flow_grpo.rewards.toy:ColorTarget",
    "clip_score": "flow_grpo.rewards.clip:CLIPScoreReward",
    "aesthetic": "flow_grpo.rewards.clip:AestheticReward",
    "clip_preference": "flow_grpo.rewards.clip:CLIPPreferenceReward",
    "pickscore": "flow_grpo.rewards.clip:pickscore",
    "hps": "flow_grpo.rewards.clip:hps",
    "hpsv2": "flow_grpo.rewards.hps:HPSv2Reward",
    "imagereward": "flow_grpo.rewards.imagereward:ImageRewardReward",
    "vlm_judge": "flow_grpo.rewards.vlm_judge:VLMJudgeReward",
    "vlm_judge_pairwise": "flow_grpo.rewards.vlm_judge:vlm_judge_pairwise",
    "vlm_judge_video": "flow_grpo.rewards.vlm_judge_video:VLMVideoJudgeReward",
    "unified_reward_point": "flow_grpo.rewards.unified_reward:UnifiedRewardPointwise",
    "unified_reward_think_pairwise": "flow_grpo.rewards.unified_reward:unified_reward_think_pairwise",
    "videoalign": "flow_grpo.rewards.videoalign:VideoAlignReward",
    "clipscore_hessel": "flow_grpo.rewards.clip:clipscore_hessel",
    "ocr": "flow_grpo.rewards.ocr:OCRReward",
    "remote": "flow_grpo.rewards.remote:RemoteReward",
    "mini_geneval": "flow_grpo.rewards.mini_geneval:MiniGenEvalReward",
    "blob_count": "flow_grpo.rewards.proxies:BlobCount",
    "motion_verifier": "flow_grpo.rewards.motion:MotionVerifierReward",
    "geneval_official": "flow_grpo.rewards.geneval_official:GenEvalOfficialReward",
    "video_per_frame": "flow_grpo.rewards.video:PerFrameReward",
    "temporal_consistency": "flow_grpo.rewards.video:TemporalConsistency",
    "dino_similarity": "flow_grpo.rewards.dino:DinoSimilarityReward",
    "adv_dino": "flow_grpo.rewards.dino:AdversarialDinoReward",
}


def register_reward(name: str, factory: Callable[..., Any] | str | None = None, *, overwrite: bool = False):
    """Register ``factory(**kwargs) -> reward`` under ``name``; usable as a decorator when ``factory`` is None."""

    def _do(f):
        if name in _REGISTRY and not overwrite:
            raise KeyError(f"reward {name!r} is already registered (pass overwrite=True to replace it)")
        _REGISTRY[name] = f
        return f

    return _do if factory is None else _do(factory)


def _resolve(spec: str) -> Callable[..., Any]:
    from mmgrpo.utils.plugins import import_object  # the plugin mechanism both front-ends share

    if not spec.partition(":")[2]:
        raise KeyError(f"bad factory spec {spec!r}: expected 'package.module:attr'")
    return import_object(spec, "reward factory")


def available_rewards() -> list[str]:
    """Sorted names accepted by :func:`build_reward` (besides ``'package.module:factory'`` import paths)."""
    return sorted(_REGISTRY)


# keyword arguments of the built-in factories that name files or folders on disk (checked to exist before loading)
_PATH_KWARGS = {"path", "checkpoint", "med_config", "model_dir", "model_path", "processor_path", "mlp_path",
                "model_config"}


def check_reward_settings(weights: Mapping[str, float], kwargs: Mapping[str, Any] | None,
                          prefix: str = "reward.kwargs", skip: Sequence[str] = ()) -> list[str]:
    """Problems with the settings of the registered rewards in ``weights``, found without building them (no model
    loads): a required argument missing (e.g. ``remote``'s ``url``, ``pickscore``'s two folders), an argument the
    factory does not take (with a close match), a weight path that does not exist. Each message names the setting
    as ``<prefix>.<reward>.<argument>``. ``'package.module:factory'`` plugins and names in ``skip`` (rewards given
    as ready objects) are not checked. A factory may list arguments it needs although they have defaults (because
    objects can be passed instead in code) as ``required_settings``."""
    import difflib
    import inspect
    import os

    out = []
    for name in weights:
        if name in skip or name not in _REGISTRY:
            continue
        kw = dict((kwargs or {}).get(name) or {})
        spec = _REGISTRY[name]
        try:
            factory = _resolve(spec) if isinstance(spec, str) else spec
        except ImportError as e:
            out.append(f"reward {name!r} cannot be imported here ({e}): install its optional dependencies")
            continue
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            continue
        free = [p for p in params.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        need = [p.name for p in free if p.default is p.empty] + list(getattr(factory, "required_settings", ()))
        for arg in need:
            if kw.get(arg) in (None, ""):
                out.append(f"{prefix}.{name}.{arg} is required by reward {name!r} and not set, e.g. "
                           f"{prefix}='{{{name}: {{{arg}: ...}}}}'")
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            known = [p.name for p in free]
            for k in kw:
                if k not in known:
                    close = difflib.get_close_matches(k, known, n=1)
                    out.append(f"{prefix}.{name}.{k}: reward {name!r} takes no argument {k!r}"
                               + (f" (did you mean {close[0]!r}?)" if close else f"; it takes {known}"))
        for k, v in kw.items():
            if (k in _PATH_KWARGS or k.endswith(("_path", "_dir"))) and isinstance(v, str) and v \
                    and not os.path.exists(v):
                out.append(f"{prefix}.{name}.{k}={v}: no such file or folder")
    return out


def build_reward(name: str, **kwargs: Any) -> RewardFn:
    """Build a registered reward by name, or any factory given as ``'package.module:factory'``.

    ``kwargs`` go to the factory (e.g. ``nan_policy``, weight paths, ``device``).
    """
    if name in _REGISTRY:
        f = _REGISTRY[name]
        factory = _resolve(f) if isinstance(f, str) else f
    elif ":" in name:
        factory = _resolve(name)
    else:
        raise KeyError(f"unknown reward {name!r}; available: {available_rewards()} "
                       "(or pass 'package.module:factory')")
    return factory(**kwargs)


# ----------------------------------------------------------------------------------------------------------
# multi-reward
# ----------------------------------------------------------------------------------------------------------
class MultiReward(Reward):
    """Run several rewards; return every component's outputs plus ``"total" = sum_k w_k * r_k``.

    Args:
        weights: ``{name: w_k}``; ``name`` is a registry name unless a ready reward is given in ``rewards``.
        mode: ``"weighted_sum"`` -> the trainer uses ``out["total"]`` as the scalar reward.
            ``"per_reward"`` -> the trainer normalises each component inside its group and sums them:
            ``mmgrpo.core.multi_reward_advantages(multi.components(out), multi.weights,
            mode="normalize_then_sum")`` (GDPO).  ``"total"`` is still returned for logging.
        rewards: optional ``{name: reward callable}`` overriding the registry.
        reward_kwargs: optional ``{name: kwargs}`` for :func:`build_reward`.
        nan_policy: applied to each component's outputs (and to ``total``); with ``"drop"``, ``valid`` is the
            AND of all components' validity.

    Output keys: the union of every component's keys (``<name>``, ``<name>/<aux>``), ``"total"``, and ``"valid"``
    under ``nan_policy="drop"``.  Component outputs must not collide.
    """

    name = "multi"
    accepts_video = True  # videos reach the components; an image Reward among them is refused (wrap it per frame)

    def __init__(self, weights: Mapping[str, float], mode: Literal["weighted_sum", "per_reward"] = "weighted_sum",
                 rewards: Mapping[str, RewardFn] | None = None,
                 reward_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                 nan_policy: NanPolicy = "raise"):
        super().__init__(nan_policy=nan_policy)
        if mode not in ("weighted_sum", "per_reward"):
            raise ValueError(f"mode must be 'weighted_sum' or 'per_reward', got {mode!r}")
        if not weights:
            raise ValueError("MultiReward needs at least one {name: weight}")
        for k, w in weights.items():
            if not math.isfinite(float(w)):
                raise ValueError(f"weight for reward {k!r} is not finite: {w!r}")
        if "total" in weights or "valid" in weights:
            raise ValueError("'total' and 'valid' are reserved output keys")
        self.weights = {k: float(w) for k, w in weights.items()}
        self.mode = mode
        rewards = dict(rewards or {})
        reward_kwargs = dict(reward_kwargs or {})
        unknown = set(reward_kwargs) - set(self.weights)
        if unknown:
            raise KeyError(f"reward_kwargs for rewards without a weight: {sorted(unknown)}")
        self.rewards: dict[str, RewardFn] = {}
        for k in self.weights:
            self.rewards[k] = rewards[k] if k in rewards else build_reward(k, **dict(reward_kwargs.get(k, {})))

    def components(self, out: Mapping[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
        """The per-reward (N,) scores to normalise in ``per_reward`` mode: ``{name: out[name]}``."""
        return {k: out[k] for k in self.weights}

    def _evaluate(self, imgs: np.ndarray, prompts: list[str], md: list[Mapping[str, Any]],
                  **kwargs: Any) -> dict[str, np.ndarray]:
        n = imgs.shape[0]  # images were converted once (Reward.evaluate); components reuse the array
        res: dict[str, np.ndarray] = {}
        valid = np.ones(n, dtype=bool)
        total = np.zeros(n, dtype=np.float32)
        for k, fn in self.rewards.items():
            if imgs.ndim == 5 and isinstance(fn, Reward) and not fn.accepts_video:
                raise RewardError(f"reward {k!r} scores images but got videos {imgs.shape}: score frames with "
                                  f"video_per_frame (reward={k!r}, aggregate mean|min)", k)
            if isinstance(fn, Reward):
                raw: Mapping[str, Any] = fn._evaluate(imgs, prompts, md, **kwargs)
            else:
                raw = fn(imgs, prompts, md, **kwargs)
            out = check_finite_numpy(raw, n, k, self.nan_policy)
            if k not in out:
                raise RewardError(f"reward {k!r} returned keys {sorted(out)} without its own key {k!r}", k)
            if "valid" in out:
                valid &= out.pop("valid")
            for key, v in out.items():
                if key in res or key == "total":
                    raise RewardError(f"MultiReward: output key {key!r} produced by more than one reward", k, key=key)
                res[key] = v
            total = total + np.float32(self.weights[k]) * out[k]
        res["total"] = total.astype(np.float32)
        if self.nan_policy == "drop" or not valid.all():
            res["valid"] = valid
        return res

    def __repr__(self) -> str:
        return f"MultiReward({self.weights}, mode={self.mode!r})"


# ----------------------------------------------------------------------------------------------------------
# pairwise preference (Pref-GRPO)
# ----------------------------------------------------------------------------------------------------------
class PairwiseScorer(Protocol):
    """``compare(images_a, images_b, prompts, metadata) -> (M,)`` with values in [0, 1]:
    1 = a preferred, 0 = b preferred, 0.5 = tie (a probability P(a > b) is also accepted).
    ``images_a``/``images_b`` are uint8 (M, H, W, 3), or videos (M, F, H, W, 3) for a video generator;
    ``prompts``/``metadata`` are those of the pair (same group). A scorer with ``accepts_video = False`` is
    refused videos by :class:`PairwisePreferenceReward` (with a clear error instead of a shape error inside it)."""

    def __call__(self, images_a: np.ndarray, images_b: np.ndarray, prompts: list[str],
                 metadata: list[Mapping[str, Any]]) -> Any: ...


class ScoreComparator:
    """Turn a pointwise reward into a pairwise scorer: ``P(a > b) = 1[s_a > s_b] + 0.5 * 1[s_a == s_b]``.

    Useful to run Pref-GRPO's win-rate reward on top of any pointwise model (and as a reference in tests).
    """

    def __init__(self, reward: RewardFn, key: str | None = None):
        self.reward = reward
        self.key = key or getattr(reward, "name", None)
        if self.key is None:
            raise ValueError("ScoreComparator: pass key= for a reward without a .name")
        # videos go to the pointwise reward, which decides (MultiReward refuses image-only components itself)
        self.accepts_video = not isinstance(reward, Reward) or reward.accepts_video

    def __call__(self, images_a, images_b, prompts, metadata):
        m = images_a.shape[0]
        out = self.reward(np.concatenate([images_a, images_b]), list(prompts) * 2, list(metadata) * 2)
        import torch

        s = torch.as_tensor(np.asarray(out[self.key], dtype=np.float64))
        sa, sb = s[:m], s[m:]
        return (sa > sb).float() + 0.5 * (sa == sb).float()


def win_rate(pref: "torch.Tensor", group_ids: "torch.Tensor") -> "torch.Tensor":
    """Per-sample win rate from a preference matrix: :func:`mmgrpo.core.pairwise_win_rate` (kept under this name).

    ``pref``: (N, N), ``pref[i, j]`` = preference of i over j in [0, 1] (only same-group pairs are read).
    ``group_ids``: (N,) int.  Returns (N,) float32 ``r_i = 1/(G_i - 1) * sum_{j != i, g_j = g_i} pref[i, j]``;
    a singleton group (G_i = 1) gets the neutral 0.5.
    """
    from mmgrpo.core.advantages import pairwise_win_rate  # torch is imported lazily in this module

    return pairwise_win_rate(pref, group_ids)


class PairwisePreferenceReward(Reward):
    """Pref-GRPO win-rate reward: ``r_i = 1/(G-1) * sum_{j != i in group} w_ij``, ``w_ij = 1[i > j]``, tie = 0.5.

    Args:
        scorer: a :class:`PairwiseScorer`.
        name: output key (default ``"pref_win_rate"``).
        symmetric: if True, each unordered pair is judged in both orders and
            ``w_ij = (c(i, j) + 1 - c(j, i)) / 2`` (cancels a position bias of the judge, 2x cost);
            otherwise ``w_ij = c(i, j)`` and ``w_ji = 1 - w_ij`` for ``i < j``.
        hard: if True (default), ``w = 1[c > 0.5] + 0.5 * 1[c == 0.5]`` (the indicator of the formula);
            if False the judge's probability is used as is (soft win rate).

    Group ids come from the ``group_ids=`` call kwarg or ``metadata[i]["group_id"]``; one of them is required
    (the prompt string is deliberately not used as a group key).  Singleton groups get 0.5 and are logged.

    A scorer may return ``{"pref": (M,), "failed": (M,) bool}`` instead of the (M,) preferences: a judge whose
    verdict could not be read (e.g. a generated answer in the wrong format) flags it, the preference it gives
    (e.g. the tie 0.5) is used, and the output gains ``<name>/judge_failures``: per sample, the number of failed
    judgements among its pairs (:class:`flow_grpo.rewards.unified_reward.UnifiedRewardThinkPairwise`).

    Videos (uint8 (N, F, H, W, 3)) are passed to the scorer whole (pairs of videos), unless the scorer says
    ``accepts_video = False`` (e.g. the VLM image pairwise judge), which is refused with an error naming it.
    """

    accepts_video = True  # the media check is the scorer's (see score)

    def __init__(self, scorer: PairwiseScorer, name: str = "pref_win_rate", symmetric: bool = False,
                 hard: bool = True, nan_policy: NanPolicy = "raise"):
        super().__init__(name=name, nan_policy=nan_policy)
        self.scorer = scorer
        self.symmetric = symmetric
        self.hard = hard

    def _judge(self, images, prompts, metadata, a_idx: list[int], b_idx: list[int]
               ) -> tuple["torch.Tensor", np.ndarray | None]:
        """(M,) judgements P(a > b) of the pairs, and the scorer's (M,) failure flags (None if it gives none)."""
        import torch

        c = self.scorer(images[a_idx], images[b_idx], [prompts[i] for i in a_idx], [metadata[i] for i in a_idx])
        failed = None
        if isinstance(c, Mapping):  # {"pref": (M,), "failed": (M,) bool}: a judge that counts unreadable verdicts
            if "pref" not in c:
                raise RewardError(f"reward {self.name!r}: a scorer returning a dict must give 'pref' (and "
                                  f"optionally 'failed'), got keys {sorted(c)}", self.name)
            failed = np.asarray(c.get("failed", np.zeros(len(a_idx), dtype=bool)), dtype=bool).reshape(-1)
            if failed.shape[0] != len(a_idx):
                raise RewardError(f"reward {self.name!r}: scorer returned {failed.shape[0]} failure flags for "
                                  f"{len(a_idx)} pairs", self.name)
            c = c["pref"]
        c = torch.as_tensor(np.asarray(c.detach().cpu() if hasattr(c, "detach") else c, dtype=np.float64)
                            ).float().reshape(-1)
        if c.shape[0] != len(a_idx):
            raise RewardError(f"reward {self.name!r}: scorer returned {c.shape[0]} judgements for "
                              f"{len(a_idx)} pairs", self.name)
        bad = ~torch.isfinite(c) | (c < 0) | (c > 1)
        if bool(bad.any()):
            pairs = [(a_idx[k], b_idx[k]) for k in torch.nonzero(bad).flatten().tolist()]
            raise RewardError(f"reward {self.name!r}: scorer returned non-finite or out-of-[0,1] judgements "
                              f"for pairs {pairs[:8]}", self.name, sorted({i for p in pairs for i in p}))
        return c, failed

    def score(self, images, prompts, metadata, group_ids=None, **kwargs):
        import torch

        from mmgrpo.core.advantages import pairwise_win_rate

        n = images.shape[0]
        if images.ndim == 5 and not getattr(self.scorer, "accepts_video", True):
            raise RewardError(f"reward {self.name!r}: the pairwise scorer {type(self.scorer).__name__} compares "
                              f"images, got videos {images.shape}; use a scorer that accepts videos (e.g. "
                              "ScoreComparator over a video reward: reward.pairwise_scorer unset)", self.name)
        if group_ids is None:
            missing = [i for i, m in enumerate(metadata) if "group_id" not in m]
            if missing:
                raise RewardError(f"reward {self.name!r}: no group_ids kwarg and metadata lacks 'group_id' for "
                                  f"samples {missing[:8]}", self.name, missing)
            group_ids = [m["group_id"] for m in metadata]
        gid = torch.as_tensor(np.asarray(group_ids)).reshape(-1)
        if gid.shape[0] != n:
            raise ValueError(f"reward {self.name!r}: got {gid.shape[0]} group ids for {n} images")
        a_idx, b_idx = [], []
        for i in range(n):
            for j in range(i + 1, n):
                if gid[i] == gid[j]:
                    a_idx.append(i)
                    b_idx.append(j)
        pref = torch.zeros(n, n)
        failures = np.zeros(n)  # per sample: failed judgements among its pairs (scorers that flag them)
        flagged = False
        if a_idx:
            judged = [self._judge(images, prompts, metadata, a_idx, b_idx)]
            if self.symmetric:
                judged.append(self._judge(images, prompts, metadata, b_idx, a_idx))
            for _, failed in judged:
                if failed is not None:
                    flagged = True
                    np.add.at(failures, np.asarray(a_idx)[failed], 1)  # a failed judgement counts for both images
                    np.add.at(failures, np.asarray(b_idx)[failed], 1)
            c = judged[0][0] if not self.symmetric else (judged[0][0] + 1.0 - judged[1][0]) / 2.0
            if self.hard:
                c = (c > 0.5).float() + 0.5 * (c == 0.5).float()
            ai, bi = torch.tensor(a_idx), torch.tensor(b_idx)
            pref[ai, bi] = c
            pref[bi, ai] = 1.0 - c
        dense = torch.unique(gid, return_inverse=True)[1]  # 0..G-1: float or bool ids are grouped by equality too
        sizes = torch.bincount(dense)
        if bool((sizes == 1).any()):
            logger.warning("reward %r: %d singleton group(s) get the neutral win rate 0.5",
                           self.name, int((sizes == 1).sum()))
        out = {self.name: pairwise_win_rate(pref, dense)}
        if flagged:  # failed judgements (each a tie) among the sample's pairs, both orders counted
            out[f"{self.name}/judge_failures"] = failures
        return out
