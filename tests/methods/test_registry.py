"""The method registry and hook API (mmgrpo.vlm.methods): the config switches enable the methods in the documented
hook order, the recipe (mmgrpo/vlm/train/) names no method and never probes a method for a hook, and the keys that
moved into ``methods`` fail with the new name."""
import ast
import pathlib

import pytest

from mmgrpo.vlm.methods import REGISTRY, VLMMethod, _load, enabled_names

_VLM = pathlib.Path(__file__).parents[2] / "mmgrpo" / "vlm"
# the recipe, and the run infrastructure its step calls (moved out of train/ as functions of explicit arguments:
# they must stay method-agnostic too)
RECIPE = sorted([*(_VLM / "train").glob("*.py"), *(_VLM / "monitor").glob("*.py"), _VLM / "checkpoint.py",
                 *(_VLM / "data" / f"{m}.py" for m in ("feed", "batch", "stream", "buffer_state")),
                 _VLM / "rewards" / "scoring.py", _VLM / "rewards" / "overlap.py", _VLM / "models" / "logprobs.py",
                 _VLM.parents[0] / "engine" / "parallel.py"])


def test_every_entry_loads_a_method_of_its_name():
    names = [s.name for s in REGISTRY]
    assert len(set(names)) == len(names)
    for s in REGISTRY:
        cls = _load(s.target)
        assert issubclass(cls, VLMMethod) and cls.name == s.name and s.help


@pytest.mark.parametrize("overrides,want", [
    ([], []),
    (["methods.tempsamp_r1.enabled=true"], ["tempsamp_r1"]),
    (["methods.t_grpo.enabled=true", "methods.tempsamp_r1.enabled=true"], ["tempsamp_r1", "t_grpo"]),
    (["methods.tw_grpo.enabled=true", "rollout.backend=vllm", "rollout.vllm_is_cap=2"], ["tw_grpo", "vllm_is"]),
    (["rollout.backend=vllm", "rollout.vllm_is_cap=0"], []),
    (["rollout.vllm_is_cap=2"], []),  # the HF backend samples from the trained module: no correction
    (["algo.filter_zero_std=true", "rollout.mask_truncated_completions=true"],
     ["dapo_dynamic_sampling", "overlong_mask"]),
    (["algo.loss_type=reg", "methods.selection.enabled=true"], ["selection", "reg_grpo"]),
    (["methods.ngrpo.enabled=true", "methods.tw_grpo.enabled=true"], ["ngrpo", "tw_grpo"]),
])
def test_config_switches_enable_the_methods_in_hook_order(overrides, want):
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    assert enabled_names(load_config(TrainConfig, None, ["model.path=x", *overrides])) == want


@pytest.mark.parametrize("path", RECIPE, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_recipe_names_no_method_and_probes_no_hook(path):
    """No config switch of a method, and no method name, in the code of the recipe (docstrings may give examples);
    no ``hasattr`` / ``getattr`` with a default (the protocol's hooks exist on every method)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    words = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    words |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    words |= {n.value for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}
    switches = {"tempsamp", "tgrpo", "twgrpo", "tempsamp_r1", "t_grpo", "tw_grpo", "filter_zero_std",
                "filter_max_rounds", "mask_truncated_completions", "vllm_is_cap", "reg", "ngrpo"}
    switches |= {s.name for s in REGISTRY}
    assert not words & switches, sorted(words & switches)
    # names bound by a loop over the methods (``for m in run.methods``), then hasattr(m, ...) / getattr(m, ..., d)
    loops = [n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.comprehension)) and "methods" in ast.unparse(n.iter)]
    bound = {x.id for n in loops for x in ast.walk(n.target) if isinstance(x, ast.Name)}
    probes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
              and (n.func.id == "hasattr" or (n.func.id == "getattr" and len(n.args) == 3))
              and isinstance(n.args[0], ast.Name) and n.args[0].id in bound]
    assert not probes, f"{path.name}: a method probed with hasattr / getattr at lines {probes}"


@pytest.mark.parametrize("old,new", [("tempsamp.enabled=true", "methods.tempsamp_r1.enabled"),
                                     ("tgrpo.alpha=0.5", "methods.t_grpo.alpha"),
                                     ("twgrpo.clamp=3", "methods.tw_grpo.clamp"),
                                     ("selection.num_keep=4", "methods.selection.num_keep")])
def test_a_moved_key_is_an_error_naming_its_new_place(old, new):
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    with pytest.raises(ValueError, match=f"'{old.split('=')[0]}' moved: it is now '{new}'"):
        load_config(TrainConfig, None, [old])


def test_a_moved_section_in_yaml_is_an_error_naming_its_new_place(tmp_path):
    from mmgrpo.vlm.config import TrainConfig
    from mmgrpo.utils.config import load_config

    (tmp_path / "r.yaml").write_text("tempsamp:\n  enabled: true\n")
    with pytest.raises(ValueError, match="r.yaml.*'tempsamp(.enabled)?' moved: it is now 'methods.tempsamp_r1"):
        load_config(TrainConfig, str(tmp_path / "r.yaml"), [])
