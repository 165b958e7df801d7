"""MkDocs hooks (``hooks:`` in mkdocs.yml): add the generated pages of ``scripts/docs_pages.py`` to the build,
and fill in the generated tables of hand-written pages (``MARKERS``).

The pages exist only in the build (nothing generated is committed), so they always match ``configs/`` and the
command-line parsers of the checkout being built.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from mkdocs.structure.files import File

_SCRIPT = Path(__file__).resolve().parent / "docs_pages.py"


def _pages_module():
    spec = importlib.util.spec_from_file_location("_mmgrpo_docs_pages", _SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


_PAGES = None


def _pages():
    global _PAGES
    if _PAGES is None:
        _PAGES = _pages_module()
    return _PAGES


def on_files(files, config):
    pages = _pages()
    for rel, make in pages.PAGES.items():
        files.append(File.generated(config, rel, content=make()))
    return files


def on_page_markdown(markdown, page, config, files):
    """Replace each generated-table marker of a hand-written page by its table."""
    for marker, make in _pages().MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown
