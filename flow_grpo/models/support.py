"""The generator support matrix of docs/generators.md, generated from the registry.

One row per ``ADAPTERS`` kind: its pipeline class and media (from the adapter class), its tiny pipelines (the
``TINY_BUILDERS`` entries whose pipeline resolves to the kind), and the evidence: the test of pipeline equality and
the trainer test that exercise it (``EVIDENCE``; tests/flow_grpo/test_support_matrix.py checks each named test
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

T = "tests/flow_grpo/"
# kind: (pipeline-equality test "file::function", trainer test "file::function", methods it trains, notes)
EVIDENCE: dict[str, tuple[str, str, str, str]] = {
    "sd3": (T + "test_models_sd35.py::test_sd35_matches_pipeline_call_bitwise",
            T + "test_trainer.py::test_each_method_trains_lora", "flow, fast, tp_grpo, g2rpo",
            "SD3-medium, SD3.5-medium (MMDiT-X) and SD3.5-large tiny variants; T5 optional"),
    "flux": (T + "test_models.py::test_adapter_ode_matches_diffusers_pipeline",
             T + "test_distributed_presets.py::test_every_preset_on_two_processes_matches_one_process",
             "every preset, 1 and 2 processes",
             "full fine-tune + FSDP2 tested (2 CPU processes)"),
    "flux_kontext": (T + "test_models_t5_kontext.py::test_kontext_ode_matches_pipeline_call_bitwise",
                     T + "test_models_t5_kontext.py::test_kontext_trains_from_a_jsonl_prompt_file_with_reference_images",
                     "fast", "reference image per prompt (JSONL)"),
    "wan": (T + "test_models_wan.py::test_wan_ode_matches_pipeline_call_bitwise",
            T + "test_trainer_video.py::test_tiny_wan_trains_lora_on_video_rewards", "flow", "Wan2.1 T2V"),
    "wan_i2v": (T + "test_models_wan_i2v.py::test_wan_i2v_ode_matches_pipeline_call_bitwise",
                T + "test_models_wan_i2v.py::test_wan_i2v_trains_from_a_jsonl_prompt_file_with_first_frames", "flow",
                "Wan2.1 I2V, first frame per prompt (JSONL)"),
    "qwen_image": (T + "test_models_qwen_image.py::test_qwen_image_batched_loop_matches_pipeline_call_bitwise",
                   T + "test_trainer_video.py::test_tiny_qwen_image_trains_lora", "flow",
                   "from the prompt string within 5e-6 (padding rounding)"),
    "qwen_image_edit": (T + "test_models_qwen_image_edit.py::test_qwen_edit_batched_loop_matches_pipeline_call_bitwise",
                        T + "test_models_qwen_image_edit.py::test_qwen_edit_trains_from_a_jsonl_prompt_file", "flow",
                        "reference image per prompt (JSONL)"),
    "flux2": (T + "test_models_flux2.py::test_flux2_dev_matches_pipeline_call_bitwise",
              T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow", "FLUX.2-dev"),
    "flux2_klein": (T + "test_models_flux2.py::test_flux2_klein_matches_pipeline_call_bitwise",
                    T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow", "FLUX.2-klein"),
    "z_image": (T + "test_models_z_image.py::test_z_image_matches_pipeline_call_bitwise",
                T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow", "Z-Image(-Turbo)"),
    "qwen_image21": (T + "test_models_qwen_image21.py::test_qwen_image21_matches_pipeline_call",
                     T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow",
                     "per-prompt pipeline calls (its batched call pads)"),
    "sana": (T + "test_models_sana.py::test_sana_matches_pipeline_call_bitwise",
             T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow",
             "no resolution binning"),
    "wan22": (T + "test_models_wan22.py::test_wan22_a14b_matches_pipeline_call_bitwise",
              T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow",
              "A14B T2V (both experts trained; DDP needs run.ddp_find_unused_parameters=true) and TI2V-5B T2V"),
    "wan22_high": (T + "test_models_wan22.py::test_wan22_one_expert_trained",
                   T + "test_trainer_generators.py::test_wan22_trains_only_one_expert", "flow, window",
                   "A14B, high-noise expert only: train its steps"),
    "wan22_low": (T + "test_models_wan22.py::test_wan22_one_expert_trained",
                  T + "test_trainer_generators.py::test_wan22_trains_only_one_expert", "flow, window",
                  "A14B, low-noise expert only: train its steps"),
    "wan22_i2v": (T + "test_models_wan22.py::test_wan22_i2v_matches_pipeline_call_bitwise",
                  T + "test_trainer_generators.py::test_wan22_i2v_trains_from_a_jsonl_prompt_file_with_reference_images",
                  "flow", "A14B I2V, both experts; TI2V-5B I2V refused"),
    "hunyuan_video15": (T + "test_models_hunyuan_video15.py::test_hunyuan_video15_matches_pipeline_call_bitwise",
                        T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow",
                        "T2V; I2V not covered"),
    "ltx2": (T + "test_models_ltx2.py::test_ltx2_matches_pipeline_call_bitwise",
             T + "test_trainer_generators.py::test_generator_trains_lora_two_epochs", "flow",
             "audio+video state, LoRA on the video stream only (audio branch frozen); video decoded"),
}


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
    from .tiny import TINY_BUILDERS

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
        eq, trainer, methods, notes = EVIDENCE[kind]
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
