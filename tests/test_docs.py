"""The manual: the reference pages are what the code generates (a changed option, route or code without
a regenerated page fails), the site builds with `mkdocs --strict` (a broken link, anchor or a page left
out of the navigation fails), and the README stays a short entry whose links all lead somewhere."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testing.reference_pages import REFERENCE, ROOT, pages

README = ROOT / "README.md"
README_MAX_LINES = 250


@pytest.mark.parametrize("name", sorted(pages()))
def test_each_reference_page_is_what_the_code_generates(name: str) -> None:
    on_disk = REFERENCE / name
    assert on_disk.exists(), f"docs/reference/{name} is missing: run `python -m testing.reference_pages`"
    assert on_disk.read_text() == pages()[name], (
        f"docs/reference/{name} is stale: run `python -m testing.reference_pages`"
    )


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_the_readme_is_an_entry_not_the_manual() -> None:
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def test_every_relative_link_of_the_readme_leads_to_a_file() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if not link.startswith(("http://", "https://"))]
    assert relative, "the README links its pages"
    assert not [link for link in relative if not (ROOT / link).exists()]
