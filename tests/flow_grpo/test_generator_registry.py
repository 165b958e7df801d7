"""The generator registry: the config's kind / tiny choices are the registries' keys, every pipeline class maps to
a registered kind, and every kind has a tiny pipeline."""
from flow_grpo.config import GENERATOR_KINDS, TINY_KINDS
from flow_grpo.models import _CONFIG_KINDS, _KIND_ONLY, _PIPELINE_TO_KIND, ADAPTERS
from flow_grpo.models.tiny import TINY_BUILDERS


def test_config_choices_are_the_registries():
    assert set(GENERATOR_KINDS) == set(ADAPTERS)
    assert set(TINY_KINDS) == set(TINY_BUILDERS)
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
