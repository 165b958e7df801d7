"""Package layout (issue 15, item 6): the top level of ``mmgrpo`` is the library both front-ends share, the Qwen-VL
front-end is ``mmgrpo.vlm``, and ``flow_grpo`` builds on the shared part only (the exceptions are listed, with why).
The pre-``mmgrpo.vlm`` import paths still work and give the very same module objects (``mmgrpo._aliases``).

Tests mirror the source layout by folder name, not by the ``vlm/`` level: ``tests/{trainer,models,rewards,methods,
data}`` test ``mmgrpo/vlm/{train,models,rewards,methods,data}``, ``tests/test_sft.py`` ``mmgrpo/vlm/sft.py``,
``tests/utils/test_timeline.py`` ``mmgrpo/vlm/timeline.py``, ``tests/data/test_synthetic_*.py``
``mmgrpo/synthetic/*.py``; ``tests/{core,engine,utils,video}`` the shared packages of the same names.
"""
from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmgrpo import _aliases

REPO = Path(__file__).resolve().parents[1]

# flow_grpo file -> the mmgrpo.vlm modules it may import, and why it genuinely needs them
FLOW_USES_VLM = {
    # The VLM judge rewards ARE Qwen-VL models: they load them with the VLM family adapters and build / collate
    # prompts with the same functions as the VLM trainer's rollouts, so the judge sees exactly what a policy sees.
    "flow_grpo/rewards/vlm_judge.py": {"mmgrpo.vlm.models.adapters", "mmgrpo.vlm.models.inputs",
                                       "mmgrpo.vlm.models.rollout"},
    "flow_grpo/rewards/vlm_judge_video.py": {"mmgrpo.vlm.models.rollout"},
    # the generative judges (UnifiedReward) decode with the VLM front-end's greedy evaluation path; VideoAlign's
    # reward model is a Qwen-VL backbone fed the video the VLM judge's way
    "flow_grpo/rewards/unified_reward.py": {"mmgrpo.vlm.models.adapters", "mmgrpo.vlm.models.inputs",
                                            "mmgrpo.vlm.models.rollout"},
    "flow_grpo/rewards/videoalign.py": {"mmgrpo.vlm.models.rollout"},
    # Qwen-Image's text encoder is a Qwen2.5-VL: the tiny test pipeline builds it with the tiny-VLM builder.
    "flow_grpo/models/tiny_qwen_image.py": {"mmgrpo.vlm.models.tiny"},
    # FLUX.2-klein's and Z-Image's text encoders are Qwen3 models, Qwen-Image 2.1's a Qwen3-VL: the tiny text
    # encoders reuse the tiny-VLM tokenizer (Qwen's special tokens) and model builders.
    "flow_grpo/models/tiny_text.py": {"mmgrpo.vlm.models.tiny"},
}
# shared modules that reach into mmgrpo.vlm (lazily, inside the function that needs it), and why
SHARED_USES_VLM = {
    # the memory planner plans VLM runs too: Qwen's token ids, the tiny-VLM model class, the VLM TrainConfig
    "mmgrpo/utils/memory_plan.py": {"mmgrpo.vlm.models.real_tokenizer", "mmgrpo.vlm.models.tiny",
                                    "mmgrpo.vlm.config"},
    # the temporal-grounding benchmarks write their samples in the VLM JSONL schema
    "mmgrpo/synthetic/tvg.py": {"mmgrpo.vlm.data.jsonl", "mmgrpo.vlm.data.schema"},
    "mmgrpo/synthetic/grounding.py": {"mmgrpo.vlm.data.jsonl", "mmgrpo.vlm.data.schema"},
}
SHARED = ("core", "engine", "utils", "video", "synthetic")
# every module path of the layout before mmgrpo.vlm existed that moved (each must still import)
OLD_PATHS = ["mmgrpo.train", "mmgrpo.train.trainer", "mmgrpo.train.faults", "mmgrpo.train.task", "mmgrpo.models",
             "mmgrpo.models.rollout", "mmgrpo.models.tiny", "mmgrpo.models.adapters", "mmgrpo.rewards",
             "mmgrpo.rewards.registry", "mmgrpo.methods", "mmgrpo.methods.dapo", "mmgrpo.cli", "mmgrpo.config",
             "mmgrpo.sft", "mmgrpo.trainer", "mmgrpo.utils.timeline", "mmgrpo.data", "mmgrpo.data.jsonl",
             "mmgrpo.data.prompts", "mmgrpo.data.synthetic_t2i", "mmgrpo.data.synthetic_t2v",
             "mmgrpo.data.synthetic_tvg", "mmgrpo.data.synthetic_grounding"]


def _imports(path: Path) -> set[str]:
    """Absolute ``mmgrpo`` modules a file imports (``from mmgrpo import x`` counts as ``mmgrpo.x``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            if node.module == "mmgrpo":
                found |= {f"mmgrpo.{a.name}" for a in node.names}
    return {m for m in found if m == "mmgrpo" or m.startswith("mmgrpo.")}


def _py_files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py") if "__pycache__" not in p.parts)


def test_flow_grpo_imports_mmgrpo_vlm_only_where_listed():
    seen = {}
    for path in _py_files("flow_grpo"):
        vlm = {m for m in _imports(path) if m.startswith("mmgrpo.vlm")}
        if vlm:
            seen[str(path.relative_to(REPO))] = vlm
    assert seen == FLOW_USES_VLM  # a new use must be justified here; a stale entry must go


def test_shared_modules_import_mmgrpo_vlm_only_where_listed():
    seen = {}
    for path in _py_files(*(f"mmgrpo/{s}" for s in SHARED)):
        vlm = {m for m in _imports(path) if m.startswith("mmgrpo.vlm")}
        if vlm:
            seen[str(path.relative_to(REPO))] = vlm
    assert seen == SHARED_USES_VLM


def test_the_repository_uses_the_new_paths_only():
    """The aliases are for code outside the repository; inside, every import names the new module."""
    this = Path(__file__).resolve()
    old = {str(p.relative_to(REPO)): sorted(f"{m} -> {_aliases.new_name(m)}" for m in _imports(p)
                                            if _aliases.new_name(m))
           for p in _py_files("mmgrpo", "flow_grpo", "eval", "scripts", "tests", "data") if p != this}
    assert {k: v for k, v in old.items() if v} == {}  # file -> ["old -> new", ...]: import the new name


_NO_VLM = """
import importlib, pkgutil, sys
import flow_grpo, mmgrpo
skip = set(sys.argv[1:])
names = [m.name for m in pkgutil.walk_packages(flow_grpo.__path__, "flow_grpo.")]
for sub in %r:
    pkg = importlib.import_module("mmgrpo." + sub)
    names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
for name in names:
    if name not in skip:
        importlib.import_module(name)
        loaded = sorted(k for k in sys.modules if k.startswith("mmgrpo.vlm"))
        assert not loaded, (name, loaded)
print(len(names))
""" % (SHARED,)


def test_flow_grpo_and_the_shared_library_load_without_the_vlm_front_end():
    """Importing every flow_grpo and shared module (in a fresh process) loads no ``mmgrpo.vlm`` module, except
    through the listed files.  Catches indirect imports the source scan above cannot see (~10-25 s)."""
    skip = [p[:-3].replace("/", ".") for p in (*FLOW_USES_VLM, *SHARED_USES_VLM)]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _NO_VLM, *skip], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert int(r.stdout) > 50  # really walked the packages


@pytest.mark.parametrize("old", OLD_PATHS)
def test_old_path_is_the_same_module(old):
    new = _aliases.new_name(old)
    assert new and new.startswith(("mmgrpo.vlm.", "mmgrpo.synthetic.")), new
    module = importlib.import_module(old)
    assert module is importlib.import_module(new) is sys.modules[old] is sys.modules[new]
    assert module.__name__ == module.__spec__.name == new  # the alias does not rename the real module


def test_old_spellings_of_imports_and_monkeypatch_reach_the_new_module(monkeypatch):
    from mmgrpo.data import Sample, synthetic_t2i
    from mmgrpo.models import rollout
    from mmgrpo.train.trainer import GRPOTrainer
    from mmgrpo.vlm.data import Sample as new_sample
    from mmgrpo.synthetic import t2i
    import mmgrpo.vlm.models.rollout
    import mmgrpo.vlm.train.trainer as new_trainer

    assert Sample is new_sample and synthetic_t2i is t2i and rollout is mmgrpo.vlm.models.rollout
    assert GRPOTrainer is new_trainer.GRPOTrainer
    marker = object()
    monkeypatch.setattr("mmgrpo.train.trainer.GRPOTrainer", marker)  # the way tests patch by dotted name
    assert new_trainer.GRPOTrainer is marker


def test_names_that_only_share_a_prefix_are_not_aliased():
    assert _aliases.new_name("mmgrpo.trainers") is None and _aliases.new_name("mmgrpo.datasets") is None
    assert _aliases.new_name("mmgrpo.core") is None and _aliases.new_name("mmgrpo.vlm.train") is None
    assert _aliases.new_name("mmgrpo.data.synthetic_tvg.x") == "mmgrpo.synthetic.tvg.x"  # longest prefix wins
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("mmgrpo.trainers")


def test_old_and_new_cli_modules_run_and_setup_points_at_the_new_one():
    """``python -m mmgrpo.cli`` (the spelling in scripts and docs) keeps working; the console script is the new
    module."""
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for mod in ("mmgrpo.cli", "mmgrpo.vlm.cli"):
        r = subprocess.run([sys.executable, "-m", mod, "--help"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.startswith("usage: mmgrpo <command>"), (mod, r.stderr[-2000:])
    assert '"mmgrpo=mmgrpo.vlm.cli:main"' in (REPO / "setup.py").read_text()
