"""The generator registry: the config's kind / tiny choices are the registries' keys, every pipeline class maps to
a registered kind, and every kind has a tiny pipeline."""
from flow_grpo.config import GENERATOR_KINDS, TINY_KINDS
from flow_grpo.models import _PIPELINE_TO_KIND, ADAPTERS
from flow_grpo.models.tiny import TINY_BUILDERS


def test_config_choices_are_the_registries():
    assert set(GENERATOR_KINDS) == set(ADAPTERS)
    assert set(TINY_KINDS) == set(TINY_BUILDERS)
    assert set(_PIPELINE_TO_KIND.values()) <= set(ADAPTERS)
    for kind, cls in ADAPTERS.items():
        assert cls.kind == kind and _PIPELINE_TO_KIND[cls.pipeline_cls_name] == kind
    assert set(ADAPTERS) <= set(TINY_BUILDERS)  # every generator has a tiny pipeline (tests, smoke runs)
