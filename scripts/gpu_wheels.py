#!/usr/bin/env python
"""Wheels for the GPU machine (no network there): download, measure, verify.

    python scripts/gpu_wheels.py download [--dest .gpu_wheels]   # pip download, CPython 3.12 manylinux x86-64
    python scripts/gpu_wheels.py verify [--dest .gpu_wheels] [--python python3.12]

``download`` reads the pinned list ``scripts/gpu_wheels.txt`` and runs ``pip download --no-deps --only-binary=:all:
--python-version 3.12 --implementation cp --platform manylinux...`` for each line (the list names every missing
dependency itself), then prints the folder's size.

``verify`` checks what travels: (1) the wheel folder plus the working tree that the device tool copies (tracked
and untracked-not-ignored files) stays within 64 MiB; (2) every wheel's declared dependencies are either in the
folder or on the GPU image (``DEVICE_HAS``, from the device tool's KINDS.md; versions checked where known), except
the ones listed in ``NEVER_IMPORTED`` with the reason; (3) with a Python 3.12 (``--python``; pyenv's is looked
for), ``pip install --no-index --no-deps --find-links DEST`` of the whole list into a scratch virtualenv succeeds and
the packages that import without torch do (decord with numpy from the registry). Exit 1 on any failure.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from email.parser import Parser
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIST = REPO / "scripts" / "gpu_wheels.txt"
LIMIT_MIB = 64.0
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux2010_x86_64", "manylinux1_x86_64")
# the GPU image's Python packages (device tool KINDS.md, image 'cuda', read 2026-11-17); versions where it gives them
DEVICE_HAS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "tokenizers": "0.23.2", "transformers": "5.17.0", "torch": "2.11.0", "torchvision": "0.26.0",
    "tiktoken": "0.14.0", "triton": "3.6.0", "sentencepiece": "0.2.2", "onnxruntime": "1.30.0",
    **{n: None for n in (
        "aiohttp aiosignal annotated-doc anyio attrs certifi charset-normalizer click cloudpickle filelock fsspec h11 "
        "hf-xet httpcore httpx idna jinja2 markupsafe multidict networkx packaging pandas peft pillow propcache psutil "
        "pyarrow pygments python-dateutil pyyaml regex requests rich scipy shellingham six sympy tensorboard timm tqdm "
        "typer typing-extensions urllib3 xxhash yarl zipp pytest pytest-timeout hypothesis frozenlist "
        "opencv-python-headless matplotlib").split()},
}
# declared dependencies that stay behind on purpose: the package is only located (a data file), or not imported
NEVER_IMPORTED = {
    "dashscope": "only its resources/qwen.tiktoken file is read (importlib.util.find_spec)",
    "open-clip-torch": "only its bpe_simple_vocab_16e6.txt.gz is read (find_spec); never imported by the check",
    "qwen-vl-utils": "not imported by the check (its av dependency is 40 MB)",
}


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def pinned() -> list[str]:
    out = []
    for line in LIST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def download(dest: Path) -> int:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(dest)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    code = subprocess.call(cmd + pinned())
    print(f"{dest}: {folder_mib(dest):.2f} MiB in {len(wheels(dest))} wheels")
    return code


def wheels(dest: Path) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(str(dest / "*.whl")))


def folder_mib(dest: Path) -> float:
    return sum(p.stat().st_size for p in wheels(dest)) / 2 ** 20


def tree_mib() -> float:
    """Tracked + untracked-not-ignored files: what the device tool copies besides ``carry``."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                         check=True).stdout.decode()
    return sum((REPO / f).stat().st_size for f in out.split("\0") if f and (REPO / f).is_file()) / 2 ** 20


def metadata(whl: Path):
    with zipfile.ZipFile(whl) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(name).decode())


def check_dependencies(dest: Path) -> list[str]:
    from packaging.requirements import Requirement
    from packaging.version import Version

    env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    have = {norm(metadata(w)["Name"]): metadata(w)["Version"] for w in wheels(dest)}
    problems = []
    for w in wheels(dest):
        md = metadata(w)
        pkg = norm(md["Name"])
        for spec in md.get_all("Requires-Dist") or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = norm(req.name)
            if dep not in have and dep not in DEVICE_HAS:
                if pkg not in NEVER_IMPORTED:
                    problems.append(f"{pkg}: needs {req} (neither carried nor on the GPU image)")
                continue
            version = have.get(dep) or DEVICE_HAS.get(dep)  # None: on the image, version not recorded
            if version and req.specifier and not req.specifier.contains(Version(version), prereleases=True):
                problems.append(f"{pkg}: needs {req}, the {'carried' if dep in have else 'GPU image'} version is "
                                f"{version}")
    missing = {norm(p.split("==")[0]) for p in pinned()} - set(have)
    problems += [f"{m}: pinned but no wheel in {dest}" for m in sorted(missing)]
    return problems


def find_python312(given: str) -> str | None:
    if given:
        return given
    for cand in [shutil.which("python3.12")] + sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12"))):
        if cand and subprocess.run([cand, "--version"], capture_output=True).returncode == 0:
            return cand
    return None


def install_check(dest: Path, py: str) -> list[str]:
    """pip install --no-index --no-deps --find-links into a scratch venv; import what needs no torch."""
    problems = []
    with tempfile.TemporaryDirectory(prefix="gpu_wheels_venv_") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([py, "-m", "venv", str(venv)], check=True)
        vpy = str(venv / "bin" / "python")
        names = [p.split("==")[0] for p in pinned()]
        r = subprocess.run([vpy, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links", str(dest)]
                           + pinned(), capture_output=True, text=True)
        if r.returncode:
            return [f"pip install --no-index failed: {r.stderr[-2000:]}"]
        got = subprocess.run([vpy, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
        print(f"installed into a scratch Python {subprocess.run([vpy, '--version'], capture_output=True, text=True).stdout.strip()} "
              f"venv with --no-index: {len(names)} packages\n{got}")
        # numpy from the registry (the GPU image has it) so decord imports; the rest need torch / transformers
        subprocess.run([vpy, "-m", "pip", "install", "-q", "numpy"], capture_output=True)
        probe = ("import dill, multiprocess, importlib_metadata, decord, importlib.util as u, os\n"
                 "assert os.path.isfile(os.path.join(u.find_spec('dashscope').submodule_search_locations[0], "
                 "'resources', 'qwen.tiktoken'))\n"
                 "assert os.path.isfile(os.path.join(u.find_spec('open_clip').submodule_search_locations[0], "
                 "'bpe_simple_vocab_16e6.txt.gz'))\nprint('imports / data files ok')")
        r = subprocess.run([vpy, "-c", probe], capture_output=True, text=True)
        print(r.stdout.strip() or r.stderr.strip()[-1000:])
        if r.returncode:
            problems.append(f"import probe failed: {r.stderr[-1000:]}")
    return problems


def verify(dest: Path, python: str) -> int:
    w, t = folder_mib(dest), tree_mib()
    print(f"wheels {w:.2f} MiB ({len(wheels(dest))} files) + working tree {t:.2f} MiB = {w + t:.2f} MiB "
          f"(limit {LIMIT_MIB:.0f} MiB)")
    problems = [] if w + t <= LIMIT_MIB else [f"{w + t:.2f} MiB > {LIMIT_MIB} MiB"]
    problems += check_dependencies(dest)
    py = find_python312(python)
    if py is None:
        print("no Python 3.12 here: the scratch-venv install check was not run")
    else:
        problems += install_check(dest, py)
    for p in problems:
        print("PROBLEM:", p)
    print("verify: ok" if not problems else f"verify: {len(problems)} problem(s)")
    return 1 if problems else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["download", "verify"])
    p.add_argument("--dest", default=str(REPO / ".gpu_wheels"), help="wheel folder (default .gpu_wheels, git-ignored)")
    p.add_argument("--python", default="", help="verify: a Python 3.12 for the scratch install (default: looked for)")
    a = p.parse_args(argv)
    dest = Path(a.dest)
    return download(dest) if a.command == "download" else verify(dest, a.python)


if __name__ == "__main__":
    raise SystemExit(main())
