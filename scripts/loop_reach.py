#!/usr/bin/env python
"""How much code one training step reaches (issue #34): a static walk of the AST from each recipe's loop.

    python scripts/loop_reach.py              # per front-end: train() lines, functions reached, files
    python scripts/loop_reach.py --list       # ... and every function reached, by file, and the boundary calls
    python scripts/loop_reach.py --json       # the numbers as JSON

The counting rule
-----------------
* **The step** is the body of the ``while`` loop of the recipe's ``train()``: ``GRPOTrainer.train``
  (``mmgrpo/vlm/train/trainer.py``) and ``FlowGRPOTrainer.train`` (``flow_grpo/train/trainer.py``). What ``train()``
  does before the loop (resume, the methods' ``on_train_start``) and after it (the final checkpoint, the export) runs
  once per run and is not counted; ``train()`` itself is reported by its line count.
* **Counted**: every function or method defined in this repository (``mmgrpo/``, ``flow_grpo/``) that the step can
  reach, transitively, on any path (error and stop paths included): called, passed as a value (a callback, a
  ``functools.partial``), entered as a context manager, read as a ``@property``, or run as the ``__call__`` of
  an instance of one of our classes (``scorer(x)``). A nested function or lambda is
  part of the function that defines it. A class's constructor counts when the class defines ``__init__`` or
  ``__post_init__``. A call through an attribute whose default is one of our functions (``PolicyLoss.fn`` =
  ``grpo_loss``, the flow default ``column_loss``) counts that default: it is what runs when no method replaces it.
* **The recipe and the rest.** The recipe is the code a researcher reads to follow one step: its package,
  ``mmgrpo/vlm/train/`` and ``flow_grpo/train/``, plus any function elsewhere that takes the recipe's trainer (a
  parameter named ``run`` / ``trainer`` without annotation or annotated with the trainer class, or any parameter
  a reached call hands the trainer to: ``f(self)``, ``f(x, tr=run)``): such a function reads the run's state, so it
  is recipe code wherever it lives. Recipe functions are counted and followed. A
  function of the rest of the project (data, models, rewards, the flow library of sampler, scoring, checkpoints,
  evaluation and epoch metrics, the shared ``mmgrpo`` library) that the recipe calls is an *entry point*: it takes
  explicit arguments, so it is counted once and not followed (like ``torchtune.generation`` seen from a torchtune
  recipe). The second line of the output follows every entry point too ("everything reached"), so that moving code
  out of the recipe never hides it.
* **Not followed** (the protocol boundaries, where a researcher plugs in): the hooks of a method (any attribute of
  :class:`mmgrpo.engine.method.Method` or a subclass: ``VLMMethod``, ``FlowMethod`` and every method module), a model
  adapter (``ModelAdapter`` / ``Policy`` for Qwen-VL, ``FlowModelAdapter`` for diffusers pipelines), the VLM rollout
  backend (``RolloutBackend``: HF ``generate`` or vLLM behind one abstract class), a reward function (an untyped
  callable the run holds), and libraries (torch, transformers, diffusers, accelerate, Python). ``--list`` names each
  boundary call the walk met.
* **How calls are resolved**, statically: names through each module's imports (relative ones too); ``obj.attr``
  through the type of ``obj``, taken from annotations (parameters, returns, dataclass fields), from
  ``x = Class(...)`` / ``x = f(...)`` (``f``'s return annotation) and ``self.x = ...`` assignments, from iteration
  over ``list[X]``; an unannotated parameter named ``run`` or ``trainer`` is the recipe's trainer (the stage
  functions take the run object so). Methods are looked up along the base classes. A call the walk cannot type is
  not counted but listed (``--list``, "untyped calls") so that a reader can check nothing of ours hides there.

The targets (issue #34): the loop function of about 150 lines, one step reaching about 15 functions in at most 3
files besides the method modules (torchtune's GRPO recipe: 3-7 functions in 1 file).
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mmgrpo", "flow_grpo")
RECIPES = {"vlm": ("mmgrpo.vlm.train.trainer", "GRPOTrainer"), "flow": ("flow_grpo.train.trainer", "FlowGRPOTrainer")}
BOUNDARY_CLASSES = {
    "mmgrpo.engine.method.Method": "method hook",
    "mmgrpo.vlm.models.adapters.ModelAdapter": "model adapter",
    "mmgrpo.vlm.models.adapters.Policy": "model adapter",
    "flow_grpo.models.base.FlowModelAdapter": "model adapter",
    "mmgrpo.vlm.models.rollout.RolloutBackend": "rollout backend",
}
# the shared library both front-ends call (math, run infrastructure, generic helpers)
SHARED = tuple(f"mmgrpo.{p}." for p in ("core", "engine", "utils", "video", "synthetic"))
CONTAINERS = {"list", "List", "Sequence", "Iterable", "Iterator", "set", "frozenset", "Collection", "deque"}


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level functions and classes


@dataclass
class Func:
    qual: str  # module.func or module.Class.method
    module: Module
    node: ast.AST
    cls: str | None = None  # qualified class name of a method


class Index:
    """Every module of the packages: definitions, imports, class attributes' types."""

    def __init__(self):
        self.modules: dict[str, Module] = {}
        for pkg in PACKAGES:
            for p in sorted((REPO / pkg).rglob("*.py")):
                parts = list(p.relative_to(REPO).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                name = ".".join(parts)
                m = Module(name, p, ast.parse(p.read_text(), str(p)))
                m.is_pkg = p.name == "__init__.py"
                self.modules[name] = m
        for m in self.modules.values():
            self._read_module(m)
        self._attr_types: dict[str, dict] = {}
        # every function / method name of ours: an untyped call of such a name is listed (it may be ours)
        self.names = {n.name for m in self.modules.values() for n in ast.walk(m.tree)
                      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def _read_module(self, m: Module) -> None:
        base = m.name.split(".") if m.is_pkg else m.name.split(".")[:-1]
        for node in ast.walk(m.tree):  # imports at any depth (lazy imports inside functions too)
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        m.imports[a.asname] = a.name
                    else:
                        m.imports.setdefault(a.name.split(".")[0], a.name.split(".")[0])
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    pre = base[:len(base) - node.level + 1]
                    src = ".".join(pre + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    m.imports[a.asname or a.name] = f"{src}.{a.name}"
        for node in m.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                m.defs[node.name] = node

    # ------------------------------------------------------------------ symbols
    def lookup(self, qual: str, depth: int = 0):
        """``("module", Module)`` | ``("func", Func)`` | ``("class", qual)`` | None for a qualified name of ours."""
        if depth > 10 or not qual.split(".")[0] in PACKAGES:
            return None
        if qual in self.modules:
            return ("module", self.modules[qual])
        mod, _, name = qual.rpartition(".")
        if mod in self.modules:
            m = self.modules[mod]
            node = m.defs.get(name)
            if isinstance(node, ast.ClassDef):
                return ("class", qual)
            if node is not None:
                return ("func", Func(qual, m, node))
            if name in m.imports:  # a re-export
                return self.lookup(m.imports[name], depth + 1)
            return None
        # Class.method
        cls_mod, _, cname = mod.rpartition(".")
        if cls_mod in self.modules and isinstance(self.modules[cls_mod].defs.get(cname), ast.ClassDef):
            return self.member(mod, name)
        return None

    def class_node(self, qual: str) -> tuple[Module, ast.ClassDef]:
        mod, _, name = qual.rpartition(".")
        m = self.modules[mod]
        return m, m.defs[name]

    def bases(self, qual: str) -> list[str]:
        m, node = self.class_node(qual)
        out = []
        for b in node.bases:
            if isinstance(b, ast.Subscript):
                b = b.value
            t = self.resolve_name(m, b)
            if t and t[0] == "class":
                out.append(t[1])
        return out

    def mro(self, qual: str) -> list[str]:
        seen, todo = [], [qual]
        while todo:
            q = todo.pop(0)
            if q not in seen:
                seen.append(q)
                todo.extend(self.bases(q))
        return seen

    def boundary(self, cls: str) -> str | None:
        for q in self.mro(cls):
            if q in BOUNDARY_CLASSES:
                return BOUNDARY_CLASSES[q]
        return None

    def member(self, cls: str, name: str):
        """``("func", Func)`` for a method, ``("prop", Func)`` for a property, ``("type", T)`` for an attribute."""
        for q in self.mro(cls):
            m, node = self.class_node(q)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name:
                    is_prop = any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list)
                    return ("prop" if is_prop else "func", Func(f"{q}.{name}", m, item, cls=q))
            t = self.attr_types(q).get(name)
            if t is not None:
                return ("type", t)
        return None

    def attr_types(self, cls: str) -> dict:
        """Types of a class's attributes: class-level annotations (dataclass fields, with a default function of
        ours as its type) and ``self.x = ...`` in its methods."""
        if cls in self._attr_types:
            return self._attr_types[cls]
        out: dict = {}
        self._attr_types[cls] = out
        m, node = self.class_node(cls)
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                t = None
                if item.value is not None:  # a default that is one of our functions: what runs by default
                    d = self.resolve_name(m, item.value)
                    t = ("funcref", d[1]) if d and d[0] == "func" else None
                out[item.target.id] = t or self.annotation(m, item.annotation)
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                env = Env(self, m, cls, item)
                for sub in ast.walk(item):
                    if isinstance(sub, (ast.Assign, ast.AnnAssign)):
                        targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
                        for tg in targets:
                            for i, el in enumerate(tg.elts if isinstance(tg, ast.Tuple) else [tg]):
                                if (isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name)
                                        and el.value.id == "self" and out.get(el.attr) is None):
                                    t = (self.annotation(m, sub.annotation) if isinstance(sub, ast.AnnAssign)
                                         else env.type_of(sub.value))
                                    if isinstance(tg, ast.Tuple):
                                        t = t[1][i] if t and t[0] == "tuple" and i < len(t[1]) else None
                                    out[el.attr] = t
        return out

    # ------------------------------------------------------------------ names and annotations
    def resolve_name(self, m: Module, node: ast.AST):
        """A Name / dotted Attribute at module scope -> symbol."""
        if isinstance(node, ast.Name):
            if node.id in m.defs:
                return self.lookup(f"{m.name}.{node.id}")
            if node.id in m.imports:
                return self.lookup(m.imports[node.id])
            return None
        if isinstance(node, ast.Attribute):
            base = self.resolve_name(m, node.value)
            if base and base[0] == "module":
                return self.lookup(f"{base[1].name}.{node.attr}")
            if base and base[0] == "class":
                return self.member(base[1], node.attr)
        return None

    def annotation(self, m: Module, node: ast.AST | None):
        """An annotation -> ``("inst", class)`` | ``("list", T)`` | ``("tuple", [T...])`` | None."""
        if node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | None
            return self.annotation(m, node.left) or self.annotation(m, node.right)
        if isinstance(node, ast.Subscript):
            head = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            if head in ("Optional", "Union"):
                return next((t for a in args if (t := self.annotation(m, a))), None)
            if head in CONTAINERS:
                t = self.annotation(m, args[0])
                return ("list", t) if t else None
            if head in ("tuple", "Tuple"):
                return ("tuple", [self.annotation(m, a) for a in args])
            return None
        s = self.resolve_name(m, node)
        return ("inst", s[1]) if s and s[0] == "class" else None

    def returns(self, f: Func):
        return self.annotation(f.module, getattr(f.node, "returns", None))


class Env:
    """The local types of one function."""

    def __init__(self, ix: Index, m: Module, cls: str | None, fn: ast.AST, run_cls: str | None = None,
                 run_params: frozenset = frozenset()):
        self.ix, self.m, self.cls = ix, m, cls
        self.vars: dict[str, object] = {}
        args = fn.args
        for a in args.posonlyargs + args.args + args.kwonlyargs:
            t = ix.annotation(m, a.annotation)
            if t is None and a.arg == "self" and cls:
                t = ("inst", cls)
            if t is None and (a.arg in ("run", "trainer") or a.arg in run_params) and run_cls:
                t = ("inst", run_cls)
            self.vars[a.arg] = t
        for _ in range(2):  # twice: an assignment may use a name assigned below it in the walk order
            for sub in ast.walk(fn):
                if isinstance(sub, ast.Assign):
                    for tg in sub.targets:
                        self._bind(tg, self.type_of(sub.value))
                elif isinstance(sub, ast.AnnAssign) and isinstance(sub.target, ast.Name):
                    self.vars[sub.target.id] = ix.annotation(m, sub.annotation) or self.type_of(sub.value)
                elif isinstance(sub, (ast.For, ast.comprehension)):
                    it = self.type_of(sub.iter)
                    self._bind(sub.target, it[1] if it and it[0] == "list" else None)
                elif isinstance(sub, ast.withitem) and sub.optional_vars is not None:
                    self._bind(sub.optional_vars, None)

    def _bind(self, tg: ast.AST, t) -> None:
        if isinstance(tg, ast.Name):
            if t is not None or tg.id not in self.vars:
                self.vars[tg.id] = t
        elif isinstance(tg, ast.Tuple):
            for i, el in enumerate(tg.elts):
                self._bind(el, t[1][i] if t and t[0] == "tuple" and i < len(t[1]) else None)

    def symbol(self, node: ast.AST):
        """What an expression names: a module / function / class / bound member / typed value, or None."""
        if isinstance(node, ast.Name):
            if node.id in self.vars:
                t = self.vars[node.id]
                return ("value", t) if t is not None else None
            return self.ix.resolve_name(self.m, node)
        if isinstance(node, ast.Attribute):
            base = self.symbol(node.value)
            if base is None:
                t = self.type_of(node.value) if isinstance(node.value, (ast.Call, ast.IfExp, ast.Subscript)) else None
                base = ("value", t) if t is not None else None
            if base is None:
                return None
            if base[0] == "module":
                return self.ix.lookup(f"{base[1].name}.{node.attr}")
            if base[0] == "class":
                return self.ix.member(base[1], node.attr)
            if base[0] in ("value", "prop"):
                t = base[1] if base[0] == "value" else self.ix.returns(base[1])
                if t and t[0] == "inst":
                    mem = self.ix.member(t[1], node.attr)
                    if mem and mem[0] == "type":
                        return ("value", mem[1]) if mem[1] is not None else None
                    return mem
            if base[0] == "type":
                return self.symbol_of_type(base[1], node.attr)
        return None

    def symbol_of_type(self, t, attr):
        if t and t[0] == "inst":
            mem = self.ix.member(t[1], attr)
            if mem and mem[0] == "type":
                return ("value", mem[1]) if mem[1] is not None else None
            return mem
        return None

    def type_of(self, node: ast.AST | None):
        if node is None:
            return None
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id == "partial" and node.args:  # functools.partial(f, ...) is f
                s = self.symbol(node.args[0])
                return ("funcref", s[1]) if s and s[0] == "func" else None
            if isinstance(f, ast.Name) and f.id == "next" and len(node.args) == 2:  # next(it, default)
                return self.type_of(node.args[1])
            s = self.symbol(f)
            if s is None:
                return None
            if s[0] == "class":
                return ("inst", s[1])
            if s[0] == "func":
                return self.ix.returns(s[1])
            return None
        if isinstance(node, ast.Subscript):
            t = self.type_of(node.value)
            if t and t[0] == "list":
                return t[1]
            return None
        if isinstance(node, ast.IfExp):
            return self.type_of(node.body) or self.type_of(node.orelse)
        if isinstance(node, ast.Tuple):
            return ("tuple", [self.type_of(e) for e in node.elts])
        if isinstance(node, ast.BoolOp):
            return next((t for v in node.values if (t := self.type_of(v))), None)
        s = self.symbol(node)
        if s is None:
            return None
        if s[0] == "value":
            return s[1]
        if s[0] == "prop":
            return self.ix.returns(s[1])
        if s[0] == "func":
            return ("funcref", s[1])
        return None


def _library(env: Env, node: ast.AST) -> bool:
    """The expression starts at a name imported from outside the packages (``np.``, ``torch.``, ``os.path.``)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    if not isinstance(node, ast.Name) or node.id in env.vars:
        return False
    q = env.m.imports.get(node.id)
    return q is not None and q.split(".")[0] not in PACKAGES


def _loop(fn: ast.AST) -> ast.While:
    for node in ast.walk(fn):
        if isinstance(node, ast.While):
            return node
    raise SystemExit(f"loop_reach: no while loop in {fn.name}")


def in_recipe(kind: str, module: Module) -> bool:
    """The recipe's own package: ``mmgrpo.vlm.train`` / ``flow_grpo.train``."""
    return module.name.startswith({"vlm": "mmgrpo.vlm.train.", "flow": "flow_grpo.train."}[kind])


def takes_run(f: Func, run_cls: str) -> bool:
    """``f`` takes the recipe's trainer object: a parameter named ``run`` / ``trainer`` (unannotated) or annotated
    with the trainer class, or ``self`` of a trainer method. Such a function reads the recipe's state: it is recipe
    code wherever it lives (counted and followed), never an entry point."""
    if f.cls == run_cls:
        return True
    args = f.node.args
    for a in args.posonlyargs + args.args + args.kwonlyargs:
        if a.annotation is None and a.arg in ("run", "trainer"):
            return True
        if a.annotation is not None and (ast.unparse(a.annotation).strip("'\"").rsplit(".", 1)[-1]
                                         == run_cls.rsplit(".", 1)[-1]):
            return True
    return False


def reach(ix: Index, kind: str, only_recipe: bool = False) -> dict:
    mod_name, cls_name = RECIPES[kind]
    run_cls = f"{mod_name}.{cls_name}"
    m, cls_node = ix.class_node(run_cls)
    train = next(n for n in cls_node.body if isinstance(n, ast.FunctionDef) and n.name == "train")
    loop = _loop(train)
    reached: dict[str, Func] = {}
    boundary: dict[str, set] = {}
    untyped: dict[str, set] = {}
    # functions some reached call hands the trainer object to -> the parameters it binds to (whatever their names)
    handed_run: dict[str, set[str]] = {}

    def visit(nodes: list[ast.AST], env: Env, where: str) -> list[Func]:
        found = []
        calls = {id(n.func) for stmt in nodes for n in ast.walk(stmt) if isinstance(n, ast.Call)}
        for stmt in nodes:
            for c in ast.walk(stmt):
                if not isinstance(c, ast.Call):
                    continue
                s = env.symbol(c.func)
                # a call handed the trainer (`f(self)`, `f(x, trainer=run)`): the callee reads the recipe's state
                pos = [i for i, a in enumerate(c.args) if env.type_of(a) == ("inst", run_cls)]
                kws = [k.arg for k in c.keywords if k.arg and env.type_of(k.value) == ("inst", run_cls)]
                if pos or kws:
                    if s and s[0] in ("func", "prop") and not (s[1].cls and ix.boundary(s[1].cls)):
                        fa = s[1].node.args
                        params = [a.arg for a in fa.posonlyargs + fa.args]
                        if s[1].cls and isinstance(c.func, ast.Attribute) and params[:1] == ["self"]:
                            params = params[1:]  # obj.method(run): the first parameter after self
                        handed_run.setdefault(s[1].qual, set()).update(
                            [params[i] for i in pos if i < len(params)] + kws)
                # calling an instance of one of our classes runs its __call__
                if s is None or s[0] == "value":
                    t = env.type_of(c.func)
                    if t and t[0] == "inst" and not ix.boundary(t[1]):
                        mem = ix.member(t[1], "__call__")
                        if mem and mem[0] == "func":
                            found.append(mem[1])
        for stmt in nodes:
            for n in ast.walk(stmt):
                if not isinstance(n, (ast.Name, ast.Attribute)) or not isinstance(n.ctx, ast.Load):
                    continue
                s = env.symbol(n)
                if isinstance(n, ast.Attribute) and (s is None or s[0] == "value"):
                    bt = env.type_of(n.value)
                    if bt and bt[0] == "inst" and (b := ix.boundary(bt[1])):
                        boundary.setdefault(f"{b}: {bt[1].rsplit('.', 1)[1]}.{n.attr}", set()).add(where)
                        continue
                    if id(n) in calls and s is None and n.attr in ix.names and not _library(env, n.value):
                        untyped.setdefault(ast.unparse(n), set()).add(where)
                        continue
                if s is None:
                    continue
                if s[0] == "value" and s[1] and s[1][0] == "funcref" and id(n) in calls:
                    s = ("func", s[1][1])
                if s[0] in ("func", "prop"):
                    f = s[1]
                    if f.cls and (b := ix.boundary(f.cls)):
                        boundary.setdefault(f"{b}: {f.qual.split('.')[-2]}.{f.qual.split('.')[-1]}",
                                            set()).add(where)
                        continue
                    found.append(f)
                elif s[0] == "class" and id(n) in calls:
                    if ix.boundary(s[1]):
                        continue
                    for init in ("__init__", "__post_init__"):
                        mem = ix.member(s[1], init)
                        if mem and mem[0] == "func" and mem[1].qual.rsplit(".", 2)[0].startswith(PACKAGES):
                            found.append(mem[1])
        return found

    def recipe_code(f: Func) -> bool:
        return in_recipe(kind, f.module) or takes_run(f, run_cls) or f.qual in handed_run

    todo = visit(loop.body, Env(ix, m, run_cls, train, run_cls), "train")
    followed: dict[str, frozenset] = {}  # function -> the parameters known to hold the run when it was followed
    while todo:
        f = todo.pop()
        reached.setdefault(f.qual, f)
        params = frozenset(handed_run.get(f.qual, ()))
        if followed.get(f.qual) == params or (only_recipe and not recipe_code(f)):
            continue  # followed already, or an entry point into another part of the project: counted, not followed
        followed[f.qual] = params
        env = Env(ix, f.module, f.cls, f.node, run_cls, params)
        todo.extend(visit(f.node.body, env, f.qual))
        # a function reached earlier that a call here hands the run to (again, or under another parameter): follow
        # it (again) as recipe code
        todo.extend(reached[q] for q, ps in handed_run.items() if q in reached and followed.get(q) != frozenset(ps))
    by_file: dict[str, list[str]] = {}
    for q, f in sorted(reached.items()):
        by_file.setdefault(str(f.module.path.relative_to(REPO)), []).append(q)
    own: dict[str, list[str]] = {}  # the recipe's functions: its package's and any function that takes the run
    for q, f in sorted(reached.items()):
        if recipe_code(f):
            own.setdefault(str(f.module.path.relative_to(REPO)), []).append(q)
    n_own = sum(map(len, own.values()))
    return {"recipe_functions": n_own, "recipe_files": len(own), "entry_points": len(reached) - n_own,
            "recipe_by_file": own,
            "recipe": f"{m.path.relative_to(REPO)}::{cls_name}.train",
            "train_lines": train.end_lineno - train.lineno + 1, "loop_lines": loop.end_lineno - loop.lineno + 1,
            "functions": len(reached), "files": len(by_file), "by_file": by_file,
            "boundary": {k: sorted(v) for k, v in sorted(boundary.items())},
            "untyped": {k: sorted(v) for k, v in sorted(untyped.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="every function reached, the boundary and untyped calls")
    ap.add_argument("--all", action="store_true", help="with --list / --json: list everything reached too")
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--front-end", choices=sorted(RECIPES), nargs="*", default=sorted(RECIPES))
    args = ap.parse_args(argv)
    ix = Index()
    res = {}
    for k in args.front_end:
        res[k] = reach(ix, k, only_recipe=True)
        full = reach(ix, k)
        res[k]["all"] = {"functions": full["functions"], "files": full["files"],
                         **({"by_file": full["by_file"]} if args.all else {})}
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    for k, r in res.items():
        print(f"{k}: {r['recipe']}: {r['train_lines']} lines (loop {r['loop_lines']})\n"
              f"  one step reaches {r['recipe_functions']} functions of the recipe in {r['recipe_files']} files,"
              f" and {r['entry_points']} entry points of the rest of the project (data, models, rewards, shared"
              f" library: counted, not followed)\n"
              f"  everything reached, every entry point followed: {r['all']['functions']} functions in"
              f" {r['all']['files']} files")
        if args.list:
            own = {q for fs in r["recipe_by_file"].values() for q in fs}
            for path, fs in r["by_file"].items():
                print(f"  {path} ({len(fs)})")
                for q in fs:
                    print(f"    {q}{'' if q in own else '    (entry point)'}")
            if args.all:
                print("  everything reached:")
                for path, fs in r["all"]["by_file"].items():
                    print(f"    {path} ({len(fs)}): {', '.join(q.rsplit('.', 1)[-1] for q in fs)}")
            print(f"  boundary calls ({len(r['boundary'])}):")
            for b, where in r["boundary"].items():
                print(f"    {b}    <- {', '.join(w.rsplit('.', 1)[-1] for w in where)}")
            print(f"  untyped calls, not followed ({len(r['untyped'])}):")
            for u, where in r["untyped"].items():
                print(f"    {u}    <- {', '.join(w.rsplit('.', 1)[-1] for w in where)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
