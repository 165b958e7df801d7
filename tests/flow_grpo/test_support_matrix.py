"""The support matrix in docs/generators.md is generated from the registry (flow_grpo.models.support) and in step
with it: every adapter kind has a row, every tiny pipeline is listed under the kind its pipeline resolves to, every
test it cites exists, and the docs table is the generator's output (regenerate with
``python -m flow_grpo.models.support --write docs/generators.md``)."""
import re
from pathlib import Path

import pytest

from flow_grpo.models import ADAPTERS
from flow_grpo.models import support
from flow_grpo.models import TINY_BUILDERS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny():
    return support.tiny_kinds()


def test_every_kind_has_evidence_that_exists():
    evidence = support.evidence()
    assert set(evidence) == set(ADAPTERS)
    for kind, (eq, trainer, _, _) in evidence.items():
        assert eq and trainer, f"{kind}: its adapter class declares no evidence (tests) for the support matrix"
        for ref in (eq, trainer):
            path, func = ref.split("::")
            text = (ROOT / path).read_text()
            assert re.search(rf"^def {func}\(", text, re.M), (kind, ref)


def test_every_tiny_pipeline_is_listed_once(tiny):
    listed = [t for k, ts in tiny.items() if k != "_cp_plan" for t in ts]
    assert sorted(listed) == sorted(TINY_BUILDERS) and set(tiny) - {"_cp_plan"} <= set(ADAPTERS)
    from flow_grpo.models.sequence_parallel import OWN_PLANS

    assert set(support.SP_TESTED) <= set(tiny["_cp_plan"]) | set(OWN_PLANS)  # a diffusers plan, or ours


def test_docs_table_is_the_generated_one(tiny):
    doc = (ROOT / "docs/generators.md").read_text()
    assert support.splice(doc, support.markdown(tiny)) == doc, \
        "docs/generators.md is out of date: python -m flow_grpo.models.support --write docs/generators.md"
    assert len(support.rows(tiny)) == len(ADAPTERS)
