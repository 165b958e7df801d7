"""The generator registry: the config accepts exactly the registries' kinds (named in its error, with the nearest),
every pipeline class maps to a registered kind, and every kind has a tiny pipeline."""
import pytest

from flow_grpo.config import load_train_config
from flow_grpo.models import _CONFIG_KINDS, _KIND_ONLY, _PIPELINE_TO_KIND, ADAPTERS
from flow_grpo.models import TINY_BUILDERS


def test_config_accepts_the_registries_kinds(monkeypatch):
    for kind in ADAPTERS:
        assert load_train_config(None, [f"model.kind={kind}"]).model.kind == kind
    for kind in TINY_BUILDERS:
        assert load_train_config(None, [f"model.tiny={kind}"]).model.tiny == kind
    # a kind registered once (one line in the registry) is accepted: the config keeps no list of its own
    monkeypatch.setitem(ADAPTERS, "my_model", ADAPTERS["sd3"])
    assert load_train_config(None, ["model.kind=my_model"]).model.kind == "my_model"


@pytest.mark.parametrize("key,value,nearest", [("model.kind", "sd", "sd3"), ("model.kind", "fluxx", "flux"),
                                               ("model.tiny", "wan22_t2v", "wan22_ti2v"), ("model.kind", "xyz", None)])
def test_an_unknown_kind_is_named_with_the_registered_ones(key, value, nearest):
    with pytest.raises(ValueError) as ei:
        load_train_config(None, [f"{key}={value}"])
    msg = str(ei.value)
    kinds = ["auto", *ADAPTERS] if key == "model.kind" else ["", *TINY_BUILDERS]
    assert f"config key '{key}': unknown generator '{value}'" in msg and str(kinds) in msg
    assert (f"did you mean '{nearest}'?" in msg) if nearest else "did you mean" not in msg


def test_the_registries_agree():
    assert set(_PIPELINE_TO_KIND.values()) <= set(ADAPTERS)
    config_kinds = {k: cls for cls, rules in _CONFIG_KINDS.items() for k, _ in rules}
    assert set(config_kinds) <= set(ADAPTERS) and set(_KIND_ONLY) <= set(ADAPTERS)
    for kind, cls in ADAPTERS.items():
        assert cls.kind == kind
        if kind in config_kinds:  # a pipeline class shared with another kind, told apart by the folder's config
            assert config_kinds[kind] == cls.pipeline_cls_name
        elif kind not in _KIND_ONLY:
            assert _PIPELINE_TO_KIND[cls.pipeline_cls_name] == kind
    # every generator has a tiny pipeline (tests, smoke runs); kind-only variants train the same folder differently
    assert set(ADAPTERS) - set(_KIND_ONLY) <= set(TINY_BUILDERS)
