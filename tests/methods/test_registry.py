"""The method registry and hook API (mmgrpo.vlm.methods): the old config switches enable the same methods, in the
documented hook order, and the trainer's loop file names no method."""
import ast
import pathlib

import pytest

from mmgrpo.vlm.methods import REGISTRY, VLMMethod, _load, enabled_names

LOOP = pathlib.Path(__file__).parents[2] / "mmgrpo" / "vlm" / "train" / "trainer.py"


def test_every_entry_loads_a_method_of_its_name():
    names = [s.name for s in REGISTRY]
    assert len(set(names)) == len(names)
    for s in REGISTRY:
        cls = _load(s.target)
        assert issubclass(cls, VLMMethod) and cls.name == s.name and s.help


@pytest.mark.parametrize("overrides,want", [
    ([], []),
    (["tempsamp.enabled=true"], ["tempsamp_r1"]),
    (["tgrpo.enabled=true", "tempsamp.enabled=true"], ["tempsamp_r1", "t_grpo"]),
    (["twgrpo.enabled=true", "rollout.backend=vllm", "rollout.vllm_is_cap=2"], ["tw_grpo", "vllm_is"]),
    (["rollout.backend=vllm", "rollout.vllm_is_cap=0"], []),
    (["rollout.vllm_is_cap=2"], []),  # the HF backend samples from the trained module: no correction
    (["algo.filter_zero_std=true", "rollout.mask_truncated_completions=true"],
     ["dapo_dynamic_sampling", "overlong_mask"]),
    (["algo.loss_type=reg", "selection.enabled=true"], ["selection", "reg_grpo"]),
    (["methods.ngrpo.enabled=true", "twgrpo.enabled=true"], ["ngrpo", "tw_grpo"]),
])
def test_old_config_switches_enable_the_methods_in_hook_order(overrides, want):
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    assert enabled_names(load_config(TrainConfig, None, ["model.path=x", *overrides])) == want


def test_the_loop_names_no_method():
    """No config switch of a method, and no method name, in the code of mmgrpo/vlm/train/trainer.py (docstrings
    may give examples)."""
    tree = ast.parse(LOOP.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    words = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    words |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    words |= {n.value for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}
    switches = {"tempsamp", "tgrpo", "twgrpo", "selection", "filter_zero_std", "filter_max_rounds",
                "mask_truncated_completions", "vllm_is_cap", "reg", "ngrpo"} | {s.name for s in REGISTRY}
    assert not words & switches, sorted(words & switches)
