"""Config loader: precedence, typed parsing, errors, round trips, CLI help (hypothesis fuzzing of overrides)."""
from __future__ import annotations

import dataclasses
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmgrpo.utils.config import (
    apply_overrides,
    config_argparser,
    config_to_dict,
    load_config,
    parse_config_cli,
    save_config,
)


@dataclass
class LoraCfg:
    r: int = field(default=4, metadata={"help": "LoRA rank"})
    alpha: float = field(default=8.0, metadata={"help": "LoRA alpha"})
    targets: list[str] = field(default_factory=lambda: ["to_q", "to_k"], metadata={"help": "target modules"})


@dataclass
class ModelCfg:
    name: str = field(default="tiny", metadata={"help": "model id or path"})
    kind: Literal["sd3", "flux"] = field(default="sd3", metadata={"help": "architecture"})
    lora: LoraCfg = field(default_factory=LoraCfg, metadata={"help": "adapter settings"})


@dataclass
class TrainCfg:
    lr: float = field(default=1e-4, metadata={"help": "peak learning rate"})
    steps: int = field(default=10, metadata={"help": "optimizer steps"})
    bf16: bool = field(default=False, metadata={"help": "bfloat16 autocast"})
    resume_from: Optional[str] = field(default=None, metadata={"help": "auto | none | path"})
    max_norm: Optional[float] = field(default=1.0, metadata={"help": "grad clip"})
    sizes: tuple[int, ...] = field(default=(512, 512), metadata={"help": "H, W"})
    pair: tuple[int, str] = field(default=(1, "a"), metadata={"help": "fixed-length tuple"})
    ids: list[int] = field(default_factory=list, metadata={"help": "ids"})
    weights: dict[str, float] = field(default_factory=dict, metadata={"help": "reward weights"})
    undocumented: int = 7  # no help text: must still be listed by --help


@dataclass
class RootCfg:
    seed: int = field(default=0, metadata={"help": "base seed"})
    model: ModelCfg = field(default_factory=ModelCfg, metadata={"help": "model section"})
    train: TrainCfg = field(default_factory=TrainCfg, metadata={"help": "training section"})
    ema: Optional[LoraCfg] = field(default=None, metadata={"help": "optional section"})
    extra: Any = field(default=None, metadata={"help": "free-form"})


def test_defaults_without_sources():
    assert load_config(RootCfg) == RootCfg()


def test_precedence_defaults_yaml_overrides(tmp_path: Path):
    y = tmp_path / "c.yaml"
    y.write_text("seed: 5\ntrain:\n  lr: 1e-5\n  steps: 20\nmodel:\n  lora:\n    r: 16\n")
    cfg = load_config(RootCfg, y, ["train.steps=30", "model.lora.alpha=2"])
    assert cfg.seed == 5  # YAML over default
    assert cfg.train.lr == 1e-5  # YAML 1.1 would have made '1e-5' a string
    assert cfg.train.steps == 30  # override over YAML
    assert cfg.model.lora.r == 16 and cfg.model.lora.alpha == 2.0
    assert cfg.model.lora.targets == ["to_q", "to_k"]  # untouched default survives a partial section
    assert cfg.train.bf16 is False


@pytest.mark.parametrize(
    "text,expected",
    [("true", True), ("True", True), ("yes", True), ("1", True), ("on", True),
     ("false", False), ("NO", False), ("0", False), ("off", False)],
)
def test_bool_words(text, expected):
    assert load_config(RootCfg, None, [f"train.bf16={text}"]).train.bf16 is expected


@pytest.mark.parametrize(
    "override,getter,expected",
    [
        ("train.lr=1e-5", lambda c: c.train.lr, 0.00001),
        ("train.lr=.5", lambda c: c.train.lr, 0.5),
        ("train.lr=3", lambda c: c.train.lr, 3.0),
        ("train.steps=1_000", lambda c: c.train.steps, 1000),
        ("train.steps=1e3", lambda c: c.train.steps, 1000),
        ("train.steps=-4", lambda c: c.train.steps, -4),
        ("train.resume_from=none", lambda c: c.train.resume_from, None),
        ("train.resume_from=NULL", lambda c: c.train.resume_from, None),
        ("train.resume_from=auto", lambda c: c.train.resume_from, "auto"),
        ("train.max_norm=null", lambda c: c.train.max_norm, None),
        ("train.max_norm=0.25", lambda c: c.train.max_norm, 0.25),
        ("train.sizes=[256, 128]", lambda c: c.train.sizes, (256, 128)),
        ("train.sizes=64,32,16", lambda c: c.train.sizes, (64, 32, 16)),
        ("train.sizes=[]", lambda c: c.train.sizes, ()),
        ("train.pair=[3, x]", lambda c: c.train.pair, (3, "x")),
        ("train.ids=[1,2,3]", lambda c: c.train.ids, [1, 2, 3]),
        ("train.weights={clip: 0.5, ocr: 2}", lambda c: c.train.weights, {"clip": 0.5, "ocr": 2.0}),
        ("train.weights.aesthetic=1e-1", lambda c: c.train.weights, {"aesthetic": 0.1}),
        ("model.name=a=b c", lambda c: c.model.name, "a=b c"),  # split on the first '=' only
        ("model.name=no", lambda c: c.model.name, "no"),  # a str field keeps the text
        ("model.kind=flux", lambda c: c.model.kind, "flux"),
        ("model.lora.targets=[q, 1]", lambda c: c.model.lora.targets, ["q", "1"]),
        ("extra={a: [1, 2.5, yes]}", lambda c: c.extra, {"a": [1, 2.5, True]}),
        ("ema.r=2", lambda c: c.ema, LoraCfg(r=2)),  # Optional section created on demand
        ("ema={alpha: 3}", lambda c: c.ema, LoraCfg(alpha=3.0)),
        ("ema=none", lambda c: c.ema, None),
    ],
)
def test_override_parsing(override, getter, expected):
    got = getter(load_config(RootCfg, None, [override]))
    assert got == expected and type(got) is type(expected)


def test_float_specials():
    assert math.isnan(load_config(RootCfg, None, ["train.lr=nan"]).train.lr)
    assert load_config(RootCfg, None, ["train.lr=-.inf"]).train.lr == -math.inf
    assert load_config(RootCfg, None, ["train.lr=inf"]).train.lr == math.inf


def test_yaml_semantics_are_type_directed(tmp_path: Path):
    y = tmp_path / "c.yaml"
    y.write_text(
        "model.name: no\n"            # YAML 1.1 would give False
        "train.resume_from: 'none'\n"  # quoted: the string, not None
        "train.max_norm: ~\n"
        "train.ids: [1, 16]\n"
        "ema: {r: 3}\n"
        "model:\n"  # an empty section (everything commented out) keeps its defaults
        "  # name: other\n"
    )
    cfg = load_config(RootCfg, y)
    assert cfg.model.name == "no"
    assert cfg.train.resume_from == "none"
    assert cfg.train.max_norm is None
    assert cfg.train.ids == [1, 16]
    assert cfg.ema == LoraCfg(r=3)
    assert cfg.model == ModelCfg(name="no")


def test_unknown_override_key_suggests_close_match():
    with pytest.raises(ValueError, match=r"train\.lrr.*train\.lr"):
        load_config(RootCfg, None, ["train.lrr=1"])
    # a bare leaf name suggests the dotted field that ends with it
    with pytest.raises(ValueError, match=r"'lr'.*'train\.lr'"):
        load_config(RootCfg, None, ["lr=1"])
    with pytest.raises(ValueError, match=r"train\.steps\.x"):
        load_config(RootCfg, None, ["train.steps.x=1"])


def test_unknown_yaml_key_names_file_and_key(tmp_path: Path):
    y = tmp_path / "bad.yaml"
    y.write_text("train:\n  stepz: 3\n")
    with pytest.raises(ValueError) as ei:
        load_config(RootCfg, y)
    msg = str(ei.value)
    assert str(y) in msg and "train.stepz" in msg and "train.steps" in msg


def test_bad_values_name_key_value_and_type(tmp_path: Path):
    with pytest.raises(ValueError) as ei:
        load_config(RootCfg, None, ["train.steps=ten"])
    assert "train.steps" in str(ei.value) and "'ten'" in str(ei.value) and "int" in str(ei.value)
    with pytest.raises(ValueError, match=r"model\.kind.*'sd3', 'flux'"):
        load_config(RootCfg, None, ["model.kind=sdxl"])
    with pytest.raises(ValueError, match=r"train\.bf16.*maybe"):
        load_config(RootCfg, None, ["train.bf16=maybe"])
    with pytest.raises(ValueError, match=r"train\.pair.*2 items"):
        load_config(RootCfg, None, ["train.pair=[1]"])
    with pytest.raises(ValueError, match=r"train\.steps"):
        load_config(RootCfg, None, ["train.steps=1.5"])
    with pytest.raises(ValueError, match="key=value"):
        load_config(RootCfg, None, ["train.steps"])
    y = tmp_path / "v.yaml"
    y.write_text("train:\n  lr: fast\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(y))}.*train\.lr.*'fast'.*float"):
        load_config(RootCfg, y)
    y.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="mapping"):
        load_config(RootCfg, y)
    with pytest.raises(FileNotFoundError):
        load_config(RootCfg, tmp_path / "missing.yaml")


@dataclass
class Validated:
    warmup: int = 1
    steps: int = 10

    def __post_init__(self):
        if self.warmup > self.steps:
            raise ValueError(f"warmup ({self.warmup}) > steps ({self.steps})")


def test_post_init_sees_final_values():
    # warmup=50 alone would fail against the default steps=10; set together it is valid
    cfg = load_config(Validated, None, ["warmup=50", "steps=100"])
    assert (cfg.warmup, cfg.steps) == (50, 100)
    with pytest.raises(ValueError, match="warmup"):
        load_config(Validated, None, ["warmup=50"])


def test_apply_overrides_does_not_mutate():
    base = RootCfg()
    new = apply_overrides(base, ["seed=3", "model.lora.r=1"])
    assert new.seed == 3 and new.model.lora.r == 1 and base.seed == 0 and base.model.lora.r == 4


def test_save_load_round_trip(tmp_path: Path):
    cfg = load_config(
        RootCfg, None,
        ["train.lr=1e-7", "train.resume_from='none'", "model.name=null", "train.weights={a: 1}", "ema.r=9",
         "extra={k: [1, x]}", "train.pair=[5, '']"],
    )
    assert cfg.train.resume_from == "'none'" or cfg.train.resume_from == "none"
    p = save_config(cfg, tmp_path / "sub" / "cfg.yaml")
    assert load_config(RootCfg, p) == cfg
    assert config_to_dict(cfg)["train"]["sizes"] == [512, 512]


# ------------------------------------------------------------------------------------------- hypothesis
_FIELD_TYPES = {
    "train.lr": float,
    "train.steps": int,
    "train.bf16": bool,
    "train.resume_from": (str, type(None)),
    "train.max_norm": (float, type(None)),
    "train.sizes": tuple,
    "train.pair": tuple,
    "train.ids": list,
    "train.weights": dict,
    "model.name": str,
    "model.kind": str,
    "model.lora.targets": list,
    "ema": (LoraCfg, type(None)),
    "extra": object,
}


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


_texts = st.one_of(
    st.text(max_size=30),
    st.from_regex(r"[-+]?[0-9_.eE]{0,8}", fullmatch=True),
    st.sampled_from(["[", "]", "{", "[1,", "{a:", ": ", "- ", "&a", "*a", "!!int x", "none", "[1, [2]]",
                     "'q", '"', "%", "@", "`", "|", ">", "? x", "!!binary x", "1e999", "0x", "nan"]),
    st.lists(st.text(max_size=5), max_size=4).map(lambda xs: "[" + ",".join(xs) + "]"),
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(sorted(_FIELD_TYPES)), text=_texts)
def test_fuzz_override_parses_or_raises_valueerror_naming_key(key, text):
    try:
        cfg = load_config(RootCfg, None, [f"{key}={text}"])
    except ValueError as exc:
        assert key in str(exc)
        return
    val = _get(cfg, key)
    assert isinstance(val, _FIELD_TYPES[key])
    s = text.strip()
    if key == "train.steps" and re.fullmatch(r"[-+]?\d+", s):
        assert val == int(s)
    if key == "train.lr":
        try:
            ref = float(s)
        except ValueError:
            ref = None
        if ref is not None:
            assert val == ref or (math.isnan(val) and math.isnan(ref))
    if key == "train.bf16":
        assert s.lower() in {"true", "yes", "on", "1", "y", "t", "false", "no", "off", "0", "n", "f"}
        assert val is (s.lower() in {"true", "yes", "on", "1", "y", "t"})
    if key == "model.name":
        assert val == text  # a str field is the exact text
    if key == "model.kind":
        assert val in ("sd3", "flux")
    if key == "train.ids":
        assert all(type(x) is int for x in val)
    if key == "train.pair":
        assert len(val) == 2 and type(val[0]) is int and type(val[1]) is str


_finite = st.floats(allow_nan=False, allow_infinity=True, width=64)
_str = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(-(2**70), 2**70),
    lr=_finite,
    steps=st.integers(-(10**6), 10**6),
    bf16=st.booleans(),
    resume=st.one_of(st.none(), _str),
    max_norm=st.one_of(st.none(), _finite),
    sizes=st.lists(st.integers(0, 10**9), max_size=4).map(tuple),
    pair=st.tuples(st.integers(), _str),
    ids=st.lists(st.integers(), max_size=4),
    weights=st.dictionaries(_str, _finite, max_size=3),
    name=_str,
    kind=st.sampled_from(["sd3", "flux"]),
    targets=st.lists(_str, max_size=3),
    ema=st.one_of(st.none(), st.builds(LoraCfg, r=st.integers(0, 64), alpha=_finite)),
)
def test_round_trip_property(tmp_path_factory, seed, lr, steps, bf16, resume, max_norm, sizes, pair, ids,
                             weights, name, kind, targets, ema):
    cfg = RootCfg(
        seed=seed,
        model=ModelCfg(name=name, kind=kind, lora=LoraCfg(targets=targets)),
        train=TrainCfg(lr=lr, steps=steps, bf16=bf16, resume_from=resume, max_norm=max_norm, sizes=sizes,
                       pair=pair, ids=ids, weights=weights),
        ema=ema,
    )
    p = save_config(cfg, tmp_path_factory.mktemp("rt") / "c.yaml")
    assert load_config(RootCfg, p) == cfg


# ------------------------------------------------------------------------------------------- CLI
def test_argparser_help_lists_every_field_recursively():
    help_text = config_argparser(RootCfg, prog="flow_grpo train", description="demo").format_help()
    for f in ["seed", "model", "model.name", "model.kind", "model.lora", "model.lora.r", "model.lora.alpha",
              "model.lora.targets", "train.lr", "train.steps", "train.bf16", "train.resume_from",
              "train.max_norm", "train.sizes", "train.pair", "train.ids", "train.weights", "train.undocumented",
              "ema", "ema.r", "extra"]:
        assert re.search(rf"^\s+{re.escape(f)}[ :]", help_text, re.M), f
    assert "--config FILE" in help_text
    assert re.search(r"train\.lr\s+\(float, default: 0\.0001\)\s*\n\s+peak learning rate", help_text)
    assert re.search(r"train\.undocumented\s+\(int, default: 7\)", help_text)
    assert "model.kind  ({'sd3', 'flux'}, default: sd3)" in help_text
    assert "LoRA rank" in help_text


def test_parse_config_cli(tmp_path: Path, capsys):
    y = tmp_path / "c.yaml"
    y.write_text("train: {steps: 3}\n")
    cfg = parse_config_cli(RootCfg, ["--config", str(y), "train.lr=2e-6", "seed=1"], prog="x")
    assert (cfg.train.steps, cfg.train.lr, cfg.seed) == (3, 2e-6, 1)
    with pytest.raises(SystemExit) as ei:
        parse_config_cli(RootCfg, ["train.stepz=1"], prog="x")
    assert ei.value.code == 2
    assert "train.stepz" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ei:
        parse_config_cli(RootCfg, ["--print-config", "seed=11"], prog="x")
    assert ei.value.code == 0
    assert "seed: 11" in capsys.readouterr().out


def test_config_import_is_light_and_help_fast():
    code = (
        "import sys, mmgrpo.utils, mmgrpo.utils.config as c\n"
        "from dataclasses import dataclass, field\n"
        "@dataclass\nclass C:\n  x: int = field(default=1, metadata={'help': 'the x'})\n"
        "c.parse_config_cli(C, ['--help'], prog='p')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "x  (int, default: 1)" in out.stdout and "the x" in out.stdout
    code2 = "import sys, mmgrpo.utils, mmgrpo.utils.config; assert 'torch' not in sys.modules, 'torch imported'"
    out2 = subprocess.run([sys.executable, "-c", code2], capture_output=True, text=True, timeout=60)
    assert out2.returncode == 0, out2.stderr


def test_all_fields_have_defaults_required():
    @dataclass
    class NoDefault:
        x: int

    with pytest.raises(TypeError, match="x"):
        load_config(NoDefault)
    assert dataclasses.is_dataclass(RootCfg)


# ------------------------------------------------------------------------------------ duplicate keys (issue 31.15)
@pytest.mark.parametrize("text,line,first,key", [
    # the recipe with two run: sections: the second silently replaced the first (bf16 and save_every were lost)
    ("seed: 1\ntrain:\n  bf16: true\n  steps: 200\nmodel:\n  name: x\ntrain:\n  lr: 1e-5\n", 7, 2, "train"),
    ("train:\n  lr: 1e-5\n  steps: 3\n  lr: 2e-5\n", 4, 2, "lr"),                       # inside one section
    ("model:\n  lora: {r: 4, r: 8}\n", 2, 2, "r"),                                         # flow mapping
])
def test_duplicate_yaml_keys_are_an_error_naming_file_and_lines(tmp_path: Path, text, line, first, key):
    y = tmp_path / "recipe.yaml"
    y.write_text(text)
    with pytest.raises(ValueError, match=rf"recipe\.yaml:{line}:\d+: invalid YAML: duplicate key '{key}' "
                                         rf"\(first on line {first}\)"):
        load_config(RootCfg, y)


def test_one_key_in_two_spellings_is_an_error(tmp_path: Path):
    y = tmp_path / "recipe.yaml"
    y.write_text("train.bf16: true\nseed: 3\ntrain:\n  bf16: false\n")
    with pytest.raises(ValueError, match=r"recipe\.yaml:4:\d+: invalid YAML: config key 'train\.bf16' is set twice "
                                         r"\(first on line 1"):
        load_config(RootCfg, y)


def test_merge_keys_may_still_be_overridden_and_distinct_keys_load(tmp_path: Path):
    y = tmp_path / "recipe.yaml"
    y.write_text("base: &b {lr: 1e-3, steps: 4}\ntrain:\n  <<: *b\n  lr: 1e-5\n")
    with pytest.raises(ValueError, match="unknown"):  # 'base' is not a config key; the merge itself is fine
        load_config(RootCfg, y)
    y.write_text("train: &b {lr: 1e-3, steps: 4}\nmodel:\n  lora: {r: 2, alpha: 3}\n")
    cfg = load_config(RootCfg, y)
    assert (cfg.train.lr, cfg.train.steps, cfg.model.lora.r) == (1e-3, 4, 2)
    assert load_config(RootCfg, None, ["train.weights={a: 1, b: 2}"]).train.weights == {"a": 1.0, "b": 2.0}
    with pytest.raises(ValueError, match="duplicate key 'a'"):
        load_config(RootCfg, None, ["train.weights={a: 1, a: 2}"])


def test_shipped_recipes_have_no_duplicate_keys():
    from mmgrpo.utils.config import _read_yaml_file

    root = Path(__file__).parents[2]
    files = sorted(root.glob("configs/**/*.yaml"))
    assert len(files) > 20
    for f in files:
        _read_yaml_file(f)
