"""``sample.shift``: an explicit flow-matching shift replacing the folder scheduler's (issue #19 leftovers).

Expected sigmas are written from diffusers' FlowMatchEulerDiscreteScheduler formula by hand (numpy), not from the
scheduler: with ``f_s(x) = s x / (1 + (s - 1) x)`` and N = 1000 train timesteps, the scheduler's ``sigma_min`` is
``f_s(1/N)``; ``set_timesteps(K)`` shifts ``linspace(1, sigma_min, K)`` once more (SD3 / Wan adapters); explicit
sigmas (FLUX adapter: ``linspace(1, 1/K, K)``) are shifted once; a final 0 is appended."""
import numpy as np
import pytest
import torch

from flow_grpo.models import adapter_from_pipeline
from flow_grpo.models.base import shifted_scheduler_config
from flow_grpo.models import TINY_BUILDERS


def _f(x, s):
    x = np.asarray(x, dtype=np.float64)
    return s * x / (1 + (s - 1) * x)


@pytest.fixture(scope="module")
def sd3():
    return adapter_from_pipeline(TINY_BUILDERS["sd3"](seed=0))


@pytest.fixture(scope="module")
def flux():
    return adapter_from_pipeline(TINY_BUILDERS["flux"](seed=0))


def _expected_set_timesteps(K, s):
    return np.append(_f(np.linspace(1.0, _f(1 / 1000, s), K), s), 0.0)


@pytest.mark.parametrize("s", [1.0, 5.0, 0.5])
def test_sd3_sigmas_follow_the_shift_formula(sd3, s):
    sd3.set_shift(s)
    try:
        got = sd3.sigmas(6, 64, 64).double().numpy()
    finally:
        sd3.set_shift(None)
    np.testing.assert_allclose(got, _expected_set_timesteps(6, s), rtol=0, atol=2e-7)


def test_none_keeps_the_folder_shift(sd3):
    assert float(sd3.pipe.scheduler.config.shift) == 3.0  # the tiny SD3 folder's shift, like SD3.5's
    np.testing.assert_allclose(sd3.sigmas(6, 64, 64).double().numpy(), _expected_set_timesteps(6, 3.0), atol=2e-7)
    assert not np.allclose(_expected_set_timesteps(6, 3.0), _expected_set_timesteps(6, 5.0), atol=1e-3)


def test_flux_fixed_shift_replaces_the_resolution_dependent_one(flux):
    assert flux.pipe.scheduler.config.use_dynamic_shifting  # the FLUX folder's mu(resolution) shift
    K = 8
    dyn = flux.sigmas(K, 64, 64).double().numpy()
    flux.set_shift(3.0)  # DanceGRPO / Pref-GRPO: sd3_time_shift(3) on linspace(1, 1/K, K)
    try:
        got = flux.sigmas(K, 64, 64).double().numpy()
    finally:
        flux.set_shift(None)
    np.testing.assert_allclose(got, np.append(_f(np.linspace(1.0, 1 / K, K), 3.0), 0.0), rtol=0, atol=2e-7)
    assert not np.allclose(got, dyn, atol=1e-3)
    assert flux.pipe.scheduler.config.use_dynamic_shifting  # the pipeline's own scheduler is untouched


def test_unipc_config_gets_flow_shift_and_bad_values_are_refused(sd3):
    conf = shifted_scheduler_config({"use_flow_sigmas": True, "flow_shift": 3.0, "use_dynamic_shifting": False}, 5)
    assert conf["flow_shift"] == 5.0 and "shift" not in conf
    with pytest.raises(ValueError, match="sample.shift must be > 0"):
        sd3.set_shift(0.0)


def test_trainer_applies_sample_shift(tmp_path):
    from flow_grpo.config import load_train_config
    from flow_grpo.train.trainer import FlowGRPOTrainer

    cfg = load_train_config(None, ["model.tiny=sd3", "sample.shift=5.0", "sample.height=64", "sample.width=64",
                                   "run.device=cpu", f"run.output_dir={tmp_path}", "data.prompts=[a]",
                                   "data.group_size=2", "data.groups_per_epoch=1", "run.mixed_precision=no",
                                   "reward.weights={brightness: 1.0}", "optim.kl_coef=0"])
    tr = FlowGRPOTrainer(cfg)
    try:
        np.testing.assert_allclose(tr.adapter.sigmas(4, 64, 64).double().numpy(),
                                   _expected_set_timesteps(4, 5.0), atol=2e-7)
    finally:
        close = getattr(tr, "close", None)
        if close:
            close()
