"""The generator support matrix of docs/generators.md, generated from the registry.

One row per ``ADAPTERS`` kind: its pipeline class and media (from the adapter class), its tiny pipelines (the
``TINY_BUILDERS`` entries whose pipeline resolves to the kind), and the evidence: the test of pipeline equality and
the trainer test that exercise it (``evidence`` on each adapter class; tests/flow_grpo/test_support_matrix.py checks each named test
exists, every kind has an entry, and the docs table is this module's output). Methods: every method preset runs on
the adapter contract alone (``flow_grpo/models/base.py``), so the column names the preset(s) a test trains the kind
with. LoRA: every adapter (``add_lora``); full fine-tuning (``enable_full_finetune``) is tested on FLUX only; FSDP2
(2 gloo processes on CPU) on FLUX (full), Wan2.1 (LoRA, with sequence parallelism) and Wan2.2 A14B (LoRA, both
experts); sequence parallelism (:mod:`flow_grpo.models.sequence_parallel`, the trainer's ``run.sequence_parallel``)
at the model level on Wan2.1 / Wan2.2 / HunyuanVideo 1.5 (our own plan) and in the trainer on Wan2.1
(``FSDP2_TESTED``, ``SP_TESTED``).

Regenerate: ``python -m flow_grpo.models.support --write docs/generators.md``.
"""
from __future__ import annotations

import sys

BEGIN, END = "<!-- support-matrix:begin -->", "<!-- support-matrix:end -->"



def evidence() -> dict[str, tuple[str, str, str, str]]:
    """kind: (pipeline-equality test "file::function", trainer test "file::function", methods it trains, notes), as
    each adapter class declares it (``evidence``)."""
    from . import ADAPTERS

    return {kind: vars(cls).get("evidence", ("", "", "", "")) for kind, cls in ADAPTERS.items()}


# tests/flow_grpo/test_sequence_parallel.py (2 gloo processes against one)
SP_TESTED = {"wan": "Ulysses, tested: model + trainer (DDP, FSDP2, resume 1<->2; 2 CPU procs)",
             "wan22": "Ulysses, tested: model level, both experts (2 CPU procs)",
             "hunyuan_video15": "Ulysses with our own plan, tested: model level (2 CPU procs, within 1e-5)"}
FSDP2_TESTED = {"flux": "tested: full fine-tune (2 CPU procs)", "wan": "tested: LoRA + seq. parallel (2 CPU procs)",
                "wan22": "tested: LoRA, both experts (2 CPU procs)"}


def tiny_kinds() -> dict[str, list[str]]:
    """{adapter kind: the tiny builders (``model.tiny=``) whose pipeline resolves to it}; builds each tiny once.
    The key ``"_cp_plan"`` holds the kinds whose transformer class declares diffusers' context-parallel plan."""
    from . import kind_of
    from . import TINY_BUILDERS

    out: dict[str, list[str]] = {"_cp_plan": []}
    for name, build in TINY_BUILDERS.items():
        pipe = build(seed=0)
        kind = kind_of(type(pipe).__name__, pipe.config)
        out.setdefault(kind, []).append(name)
        if getattr(type(pipe.transformer), "_cp_plan", None) is not None and kind not in out["_cp_plan"]:
            out["_cp_plan"].append(kind)
    return out


def _sequence_parallel(kind: str, tiny: dict[str, list[str]]) -> str:
    from . import _KIND_ONLY
    from .sequence_parallel import UNSUPPORTED

    base = "wan22" if kind in _KIND_ONLY else kind
    if kind in SP_TESTED:
        return SP_TESTED[kind]
    if base in UNSUPPORTED:
        return "refused (fails in diffusers)"
    return "plan exists, untested" if base in tiny["_cp_plan"] else "no (no diffusers plan)"


def rows(tiny: dict[str, list[str]] | None = None) -> list[list[str]]:
    from . import ADAPTERS, _KIND_ONLY

    tiny = tiny_kinds() if tiny is None else tiny
    out = []
    for kind, cls in ADAPTERS.items():
        eq, trainer, methods, notes = evidence()[kind]
        tinies = ", ".join(f"`{t}`" for t in tiny.get(kind, [])) or ("(that of `wan22`)" if kind in _KIND_ONLY else "")
        lora_full = "LoRA; full (FSDP2) tested" if kind == "flux" else "LoRA; full untested"
        out.append([f"`{kind}`", f"`{cls.pipeline_cls_name}`", cls.media, tinies, f"`{eq.split('::')[1]}`",
                    f"`{trainer.split('::')[1]}` ({methods})", lora_full,
                    FSDP2_TESTED.get(kind, "untested"), _sequence_parallel(kind, tiny), notes])
    return out


def markdown(tiny: dict[str, list[str]] | None = None) -> str:
    head = ["kind", "pipeline class", "media", "tiny (`model.tiny=`)", "pipeline-equality test", "trainer test (methods)",
            "LoRA / full", "FSDP2", "seq. parallel", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(tiny)]
    return "\n".join(lines)


def splice(doc: str, table: str) -> str:
    """``doc`` with the text between the BEGIN / END markers replaced by ``table``."""
    if BEGIN not in doc or END not in doc:
        raise ValueError(f"the document has no {BEGIN} ... {END} markers")
    pre, rest = doc.split(BEGIN, 1)
    _, post = rest.split(END, 1)
    return f"{pre}{BEGIN}\n{table}\n{END}{post}"


def main(argv: list[str]) -> int:
    if argv[:1] != ["--write"] or len(argv) != 2:
        print(markdown())
        return 0
    with open(argv[1]) as f:
        doc = f.read()
    with open(argv[1], "w") as f:
        f.write(splice(doc, markdown()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
