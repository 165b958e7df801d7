"""scripts/loop_reach.py (issue #34's measure of how much code one training step reaches) follows what it should and
stops where its counting rule says: the default losses are counted, method hooks / model adapters / the rollout
backend are boundaries, the shared library is an entry point, not followed."""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def index():
    spec = importlib.util.spec_from_file_location("loop_reach", REPO / "scripts" / "loop_reach.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["loop_reach"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.Index()


@pytest.fixture(scope="module")
def reach(index):
    mod = sys.modules["loop_reach"]
    return {k: (mod.reach(index, k, only_recipe=True), mod.reach(index, k)) for k in ("vlm", "flow")}


def _names(r):
    return {q for fs in r["by_file"].values() for q in fs}


def test_the_step_reaches_the_default_losses_and_stops_at_the_boundaries(reach):
    vlm, vlm_all = reach["vlm"]
    flow, flow_all = reach["flow"]
    # the stages of a step and the defaults that run when no method replaces them
    assert {"mmgrpo.vlm.train.steps.collect", "mmgrpo.vlm.train.steps.optimize",
            "mmgrpo.vlm.methods.base.grpo_loss"} <= _names(vlm)  # grpo_loss: PolicyLoss.fn's default
    assert {"flow_grpo.train.steps.rollout", "flow_grpo.train.steps.update", "flow_grpo.train.steps.column_loss",
            "flow_grpo.sampler.sample_trajectories"} <= _names(flow)  # column_loss: through functools.partial
    # method hooks, adapters and the rollout backend are boundaries: named, never followed
    assert any(b.startswith("method hook: ") and b.endswith(".on_advantages") for b in flow["boundary"])
    assert any(b.startswith("method hook: ") and b.endswith(".on_rewards") for b in vlm["boundary"])
    assert any(b.startswith("rollout backend: ") for b in vlm["boundary"])
    assert any(b.startswith("model adapter: FlowModelAdapter.") for b in flow["boundary"])
    assert not any(q.startswith(("mmgrpo.vlm.methods.", "flow_grpo.methods.")) and q.rsplit(".", 1)[1] in
                   ("on_rewards", "on_advantages", "end_of_step") for q in _names(vlm_all) | _names(flow_all))
    # the shared library: an entry point counts (not followed); followed only in the whole count
    assert "mmgrpo.core.advantages.group_advantages" in _names(vlm)
    assert "mmgrpo.core.advantages._check_group_ids" not in _names(vlm)
    assert "mmgrpo.core.advantages._check_group_ids" in _names(vlm_all)
    for r, whole in ((vlm, vlm_all), (flow, flow_all)):
        assert r["recipe_functions"] + r["entry_points"] == r["functions"] < whole["functions"]


def test_a_function_that_takes_the_run_is_recipe_code_wherever_it_lives(reach):
    import ast

    mod = sys.modules["loop_reach"]
    run_cls = "flow_grpo.train.trainer.FlowGRPOTrainer"
    src = ("def stage(run, traj): ...\ndef typed(t: 'FlowGRPOTrainer'): ...\n"
           "def explicit(adapter, rewards, prompts): ...\ndef named_trainer(trainer, x=1): ...\n")
    fns = {n.name: n for n in ast.parse(src).body}
    m = mod.Module("flow_grpo.scoring", REPO / "flow_grpo" / "scoring.py", ast.parse(src))
    took = {k for k, n in fns.items() if mod.takes_run(mod.Func(f"flow_grpo.scoring.{k}", m, n), run_cls)}
    assert took == {"stage", "typed", "named_trainer"}
    # the flow recipe is its package; what it calls elsewhere takes explicit arguments (an entry point)
    flow, _ = reach["flow"]
    assert all(p.startswith("flow_grpo/train/") for p in flow["recipe_by_file"])
    assert flow["recipe_functions"] <= 15 and flow["recipe_files"] <= 3  # issue #34's target, kept


def _library_functions_taking_the_run(index, front_end: str, run_cls: str) -> list[str]:
    """Every function of the front-end package outside its recipe (train/) and its methods (their protocol hands them
    the run) that takes the trainer, whether one step reaches it or not (resume, export, setup, validation)."""
    import ast

    mod = sys.modules["loop_reach"]
    found = []
    for m in index.modules.values():
        if not m.name.startswith(f"{front_end}.") or m.name.startswith((f"{front_end}.train", f"{front_end}.methods")):
            continue
        for node in ast.walk(m.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if mod.takes_run(mod.Func(f"{m.name}.{node.name}", m, node), run_cls):
                    found.append(f"{m.name}.{node.name}")
    return found


def test_the_flow_library_never_takes_the_run(index):
    """Every function of flow_grpo outside the recipe and the methods takes explicit arguments."""
    assert _library_functions_taking_the_run(index, "flow_grpo", "flow_grpo.train.trainer.FlowGRPOTrainer") == []


def test_the_vlm_recipe_is_its_package_and_its_library_never_takes_the_run(reach, index):
    """The VLM recipe (issue #34's target, kept): one step reaches <= 15 functions of ``mmgrpo/vlm/train/`` in <= 3
    files; every function of ``mmgrpo.vlm`` outside the recipe and the methods takes explicit arguments (validation,
    checkpoints, the prompt feed)."""
    vlm, _ = reach["vlm"]
    assert all(p.startswith("mmgrpo/vlm/train/") for p in vlm["recipe_by_file"])
    assert vlm["recipe_functions"] <= 15 and vlm["recipe_files"] <= 3
    assert _library_functions_taking_the_run(index, "mmgrpo.vlm", "mmgrpo.vlm.train.trainer.GRPOTrainer") == []


def test_a_callee_handed_the_run_is_recipe_code_and_a_callable_object_runs_its_call(monkeypatch):
    """Two ways code could hide from the count: a library function that gets the trainer under another name
    (``def f(tr)`` called as ``f(self)``) is recipe code, followed and counted; calling an instance of one of our
    classes (``scorer(x)``) reaches its ``__call__``."""
    import ast

    mod = sys.modules["loop_reach"]
    ix = mod.Index.__new__(mod.Index)
    ix.modules, ix._attr_types = {}, {}
    sources = {
        "flow_grpo.train.fake": ("from flow_grpo.fakelib import helper, Scorer\n"
                                 "class Run:\n"
                                 "    def train(self):\n"
                                 "        scorer = Scorer()\n"
                                 "        while True:\n"
                                 "            helper(1, self)\n"
                                 "            scorer(2)\n"),
        "flow_grpo.fakelib": ("def helper(x, tr):\n    return inner(tr)\n"
                              "def inner(tr):\n    return 0\n"
                              "class Scorer:\n    def __call__(self, x):\n        return _score(x)\n"
                              "def _score(x):\n    return x\n"),
    }
    for name, src in sources.items():
        m = mod.Module(name, REPO / (name.replace(".", "/") + ".py"), ast.parse(src))
        m.is_pkg = False
        ix.modules[name] = m
    for m in ix.modules.values():
        ix._read_module(m)
    ix.names = {n.name for m in ix.modules.values() for n in ast.walk(m.tree) if isinstance(n, ast.FunctionDef)}
    monkeypatch.setitem(mod.RECIPES, "flow", ("flow_grpo.train.fake", "Run"))
    r = mod.reach(ix, "flow", only_recipe=True)
    recipe = {q for fs in r["recipe_by_file"].values() for q in fs}
    # helper takes the run as `tr`: recipe code, followed (so inner, handed the run too, is counted)
    assert recipe == {"flow_grpo.fakelib.helper", "flow_grpo.fakelib.inner"}
    # Scorer.__call__ is an entry point (it takes no run): counted, not followed
    assert _names(r) == recipe | {"flow_grpo.fakelib.Scorer.__call__"}
    assert "flow_grpo.fakelib._score" in _names(mod.reach(ix, "flow"))
