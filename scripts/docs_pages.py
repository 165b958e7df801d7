#!/usr/bin/env python
"""Pages of the user guide that are generated, not written (MkDocs builds them through ``scripts/mkdocs_hooks.py``).

* ``recipes.md``: one row per recipe in ``configs/vlm`` and ``configs/flow`` (the release it reproduces, its main
  settings, where its prompts come from, its experiment script and its last recorded smoke status);
* the VLM reward table of ``rewards_overview.md`` (the marker ``<!-- generated: vlm-rewards -->``);
* ``reference/cli.md``: every option of ``mmgrpo train``, ``flow_grpo train``, ``eval/score.py``,
  ``eval/generate_vlm.py`` and ``eval/generate_t2i.py``, read from their argument parsers (the same parsers
  ``--help`` prints), so the reference cannot fall behind the code.

    python scripts/docs_pages.py OUT_DIR     # write both pages into OUT_DIR (to read them without MkDocs)

Nothing here imports torch: the parsers are built from the config dataclasses.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Iterable

import yaml

REPO = Path(__file__).resolve().parents[1]
FRONT_ENDS = (("vlm", "mmgrpo train"), ("flow", "flow_grpo train"))
# the recipes run end to end by the test suite (tests/test_experiments.py::test_smoke_mode_trains_and_evaluates)
SUITE_SMOKE_TEST = REPO / "tests" / "test_experiments.py"


# ---------------------------------------------------------------------------------------------- recipes page
def _comment_header(text: str) -> list[str]:
    """The recipe's leading comment block, one string per line without ``# ``."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return lines


def _field(header: list[str], *labels: str) -> str:
    """The sentence of the header that starts with ``label:`` (at a line start or after a full stop), without the
    label: up to the next full stop or the next labelled sentence."""
    text = " ".join(header)
    for label in labels:
        m = re.search(r"(?:^|(?<=\. ))" + re.escape(label) + r": (.*?)(?=\. [A-Z]|\.$|$| [A-Z][a-z]+(?: [a-z]+)*: )",
                      text)
        if m:
            return m.group(1).strip()
    return ""


def _title(header: list[str]) -> str:
    """The header's first sentence (a period followed by a space, or a colon, outside parentheses)."""
    first = " ".join(header[:3]) if header else ""
    depth = 0
    for i, ch in enumerate(first):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and i > 0 and ((ch == "." and first[i + 1:i + 2] in (" ", "")) or ch == ":"):
            return first[:i].strip()
    return first.strip()


_NO_CODE = re.compile(r"no released code|code not reachable|code is not public|not released", re.I)


def _release(header: list[str]) -> str:
    """The release a recipe follows: its ``Release:`` line up to the first parenthesis or colon, or "no released
    code" when the header says so."""
    rel = _field(header, "Release")
    if rel:
        rel = re.split(r" \(|: ", rel, maxsplit=1)[0].strip().rstrip(",;.")
        repo = re.search(r"\(([\w-]+/[\w.-]+)", _title(header))  # the repository, when the title names it
        if repo and repo.group(1) not in rel:
            rel = f"{repo.group(1)} {rel}"
        return rel
    text = " ".join(header)
    if _NO_CODE.search(text):
        m = re.search(r"re-implementation \(([\w.-]+/[\w.-]+)", text)
        return "no released code" + (f" (public re-implementation: {m.group(1)})" if m else "")
    return "see the file's header"


def _prompts(header: list[str], cfg: dict) -> str:
    text = _field(header, "Prompt", "Prompts", "Prompt and media")
    if text:
        return re.split(r"(?<=[a-z)]): | \(", text, maxsplit=1)[0].strip().rstrip(",;.") or text
    tmpl = _get(cfg, "data.prompt_template")
    if tmpl:
        return f"`{tmpl}` template"
    return "see the file's header"


def _script_data(name: str) -> str:
    """The training data file the experiment script passes (``data.train_file=`` / ``data.train_path=``)."""
    script = REPO / "scripts" / "experiments" / f"{name}.sh"
    if not script.exists():
        return ""
    m = re.search(r"data\.train_(?:file|path)=\"?([^\s\"]+)", script.read_text())
    return f"`{m.group(1)}`" if m else ""


def _get(d: dict, dotted: str, default: Any = None) -> Any:
    for key in dotted.split("."):
        if not isinstance(d, dict) or key not in d:
            return default
        d = d[key]
    return d


def _settings(front: str, cfg: dict) -> list[str]:
    """The settings a reader compares first, as ``key=value`` strings (only those the recipe sets)."""
    keys = (["model.family", "data.task", "model.lora.enabled", "rollout.group_size", "optim.lr", "algo.kl_coef",
             "reward.weights", "reward.parse_mode", "data.prompt_template"] if front == "vlm" else
            ["method", "model.kind", "model.lora.enabled", "data.group_size", "sample.num_steps", "optim.lr",
             "optim.kl_coef", "reward.weights"])
    out = []
    for k in keys:
        v = _get(cfg, k)
        if v is None:
            continue
        if isinstance(v, dict):
            v = "{" + ", ".join(f"{a}: {b}" for a, b in v.items()) + "}"
        out.append(f"`{k}={v}`")
    def on(name: str, sub: Any) -> bool:  # a method section that is switched on (data selection: a criterion)
        return isinstance(sub, dict) and bool(sub.get("enabled") or (name == "selection" and sub.get("criterion")))

    switched = sorted(name for name, sub in (cfg.get("methods") or {}).items() if on(name, sub))
    if switched:
        out.append("switches: " + ", ".join(f"`{s}`" for s in switched))
    return out


def smoke_status() -> tuple[dict[str, str], str]:
    """``{recipe: "pass 15.1 s"}`` from the last ``smoke_all.sh`` table recorded in docs/experiments.md, and the
    sentence that dates it."""
    text = (REPO / "docs" / "experiments.md").read_text()
    m = re.search(r"^Last `smoke_all\.sh` run \(([^)]*)\)", text, re.M)
    date = re.search(r"\d{4}-\d{2}-\d{2}", m.group(1)) if m else None
    commit = re.search(r"commit `(\w+)`", m.group(1)) if m else None
    when = (f"{date.group(0) if date else 'undated'}" + (f", commit `{commit.group(1)}`" if commit else "")
            if m else "no recorded run")
    status = {}
    for row in re.finditer(r"^\| ([a-z0-9_]+) \| (pass|fail[^|]*) \| ([0-9.]+) \|$", text, re.M):
        status[row.group(1)] = f"{row.group(2)} ({row.group(3)} s)"
    return status, when


def suite_smoke_recipes() -> set[str]:
    text = SUITE_SMOKE_TEST.read_text()
    m = re.search(r"parametrize\(\"name\", \[([^\]]*)\]\)\ndef test_smoke_mode_trains_and_evaluates", text)
    return set(re.findall(r"\"([a-z0-9_]+)\"", m.group(1))) if m else set()


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def recipes_page() -> str:
    status, when = smoke_status()
    in_suite = suite_smoke_recipes()
    lines = [
        "# Recipes",
        "",
        "<!-- generated by scripts/docs_pages.py from configs/ at every docs build: do not edit -->",
        "",
        "One YAML per paper experiment, in `configs/vlm/` (`mmgrpo train --config FILE`) and `configs/flow/`",
        "(`flow_grpo train --config FILE`). Each YAML's comments say which release it reproduces and mark every value",
        "the paper leaves open as \"chose\"; `scripts/experiments/<name>.sh` trains it and runs its paired evaluation",
        "([Paper experiments](experiments.md)). This page is generated from the files at every docs build.",
        "",
        f"**Smoke status** is the last recorded `bash scripts/experiments/smoke_all.sh` run ({when}; CPU, tiny",
        "models, synthetic data, 2 steps: wiring, not results). Recipes marked *suite* also run in smoke mode in the",
        "test suite; the suite loads every recipe into its trainer's config. None has been run at paper scale.",
        "",
    ]
    for front, cmd in FRONT_ENDS:
        files = sorted((REPO / "configs" / front).glob("*.yaml"))
        summary = [f"## {'Qwen-VL front-end' if front == 'vlm' else 'Flow-matching front-end'} (`{cmd}`)", "",
                   "| recipe | what | smoke |", "|---|---|---|"]
        details = []
        for f in files:
            text = f.read_text()
            header = _comment_header(text)
            cfg = yaml.safe_load(text) or {}
            name = f.stem
            release, prompts = _release(header), _prompts(header, cfg)
            data = _script_data(name)
            if data:
                prompts = (f"{data} (experiment script)" if prompts == "see the file's header"
                           else f"{prompts} (script: {data})")
            script = REPO / "scripts" / "experiments" / f"{name}.sh"
            smoke = status.get(name, "not recorded")
            if name in in_suite:
                smoke += ", *suite*"
            summary.append("| " + " | ".join(_cell(c) for c in (f"[`{name}`](#{name})", _title(header), smoke)) + " |")
            details += [f"### {name} {{#{name}}}", "",
                        f"`configs/{front}/{name}.yaml`" + (f" · `scripts/experiments/{name}.sh`" if script.exists()
                                                            else " · no experiment script"), "",
                        f"* **What:** {_title(header)}",
                        f"* **Release:** {release}",
                        f"* **Main settings:** {', '.join(_settings(front, cfg))}",
                        f"* **Prompts / data:** {prompts}",
                        f"* **Smoke:** {smoke}", ""]
        lines += summary + [""] + details
    demo = sorted((REPO / "configs" / "demo").glob("*.yaml"))
    compare = sorted((REPO / "configs" / "compare").glob("*/*.yaml"))
    lines += ["## Other configs", "",
              f"* `configs/demo/` ({', '.join(p.name for p in demo)}): the CPU demo's settings "
              "([Get started](get_started.md)).",
              f"* `configs/compare/` ({len(compare)} files in {', '.join(sorted({p.parent.name for p in compare}))}):"
              " the method switches of the method comparisons ([Methods](methods.md)).", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- CLI reference
# (title, how to run it, how to get its --help text in this process); the eval scripts are loaded from their files
CLIS = (
    ("mmgrpo train", "mmgrpo train --help", ("mmgrpo.vlm.cli", ["train", "--help"])),
    ("mmgrpo plan", "mmgrpo plan --help", ("mmgrpo.vlm.cli", ["plan", "--help"])),
    ("mmgrpo check", "mmgrpo check --help", ("mmgrpo.vlm.cli", ["check", "--help"])),
    ("flow_grpo train", "flow_grpo train --help", ("flow_grpo.cli", ["train", "--help"])),
    ("flow_grpo plan", "flow_grpo plan --help", ("flow_grpo.cli", ["plan", "--help"])),
    ("flow_grpo check", "flow_grpo check --help", ("flow_grpo.cli", ["check", "--help"])),
    ("eval/score.py", "python eval/score.py --help", ("eval/score.py", ["--help"])),
    ("eval/generate_vlm.py", "python eval/generate_vlm.py --help", ("eval/generate_vlm.py", ["--help"])),
    ("eval/generate_t2i.py", "python eval/generate_t2i.py --help", ("eval/generate_t2i.py", ["--help"])),
)
_KEY = re.compile(r"^(\s{2,})([a-z_][\w]*(?:\.[\w]+)*)(?::  \[section ([^\]]*)\](?: \(default: none\))?|"
                  r"  \((.*), default: (.*)\))$")


def help_text(target: str, argv: list[str]) -> str:
    """What ``--help`` prints, from the command's own ``main`` in this process (no torch is imported)."""
    import contextlib
    import io

    if target.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"_docs_{Path(target).stem}", REPO / target)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(target)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            mod.main(list(argv))
        except SystemExit:
            pass
    return buf.getvalue()


def split_help(text: str) -> tuple[str, list[tuple[str, str, str, str]]]:
    """``--help`` text -> (the argparse part, [(key, type, default, help)] of the ``key=value`` config fields)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith("config fields")), None)
    if start is None:
        return text.rstrip(), []
    head, fields = "\n".join(lines[:start]).rstrip(), []
    for ln in lines[start:]:
        m = _KEY.match(ln)
        if m:
            if m.group(3) is not None:
                fields.append((m.group(2), f"section {m.group(3)}", "", ""))
            else:
                fields.append((m.group(2), m.group(4), m.group(5), ""))
        elif fields and ln.strip():
            key, tp, default, what = fields[-1]
            fields[-1] = (key, tp, default, (what + " " + ln.strip()).strip())
    return head, fields


def cli_page() -> str:
    lines = ["# Command-line reference", "",
             "<!-- generated by scripts/docs_pages.py from the commands' --help at every docs build: do not edit -->",
             "", "Generated from what each command's `--help` prints, at every docs build; `tests/test_docs.py`",
             "checks that every option and config key of `mmgrpo train`, `flow_grpo train` and `eval/score.py` is",
             "on this page. Config-style commands take `key=value` overrides: defaults < `--config` YAML <",
             "`--profile NAME` < `key=value`.", ""]
    for title, how, (target, argv) in CLIS:
        head, fields = split_help(help_text(target, argv))
        lines += [f"## `{title}`", "", f"`{how}`", "", "```text", head, "```", ""]
        if fields:
            lines += [f"### `{title}` config keys", "", "| key | type | default | what |", "|---|---|---|---|"]
            for key, tp, default, what in fields:
                if tp.startswith("section"):
                    lines.append(f"| **`{key}`** | {_cell(tp)} | | |")
                else:
                    lines.append("| " + " | ".join((f"`{key}`", _cell(tp), f"`{_cell(default)}`", _cell(what))) + " |")
            lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- tables in pages
def vlm_rewards_table() -> str:
    """The VLM reward registry as a table (name, tasks, what it computes)."""
    from mmgrpo.vlm.rewards.registry import REWARDS

    rows = ["| reward | tasks | what |", "|---|---|---|"]
    rows += [f"| `{name}` | {', '.join(tasks)} | {_cell(what)} |" for name, (tasks, what) in REWARDS.items()]
    return "\n".join(rows)


PAGES = {"recipes.md": recipes_page, "reference/cli.md": cli_page}
# a marker in a hand-written page -> the generated text that replaces it at build time
MARKERS = {"<!-- generated: vlm-rewards -->": vlm_rewards_table}


def main(argv: Iterable[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="folder to write recipes.md and reference/cli.md into")
    args = p.parse_args(argv)
    for rel, make in PAGES.items():
        path = Path(args.out) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(make())
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
