"""The manual: the reference pages are what the code generates (a changed option, route or code without
a regenerated page fails), the site builds with `mkdocs --strict` (a broken link, anchor or a page left
out of the navigation fails) and renders what its sources say (no `\\|` shown in a cell, no placeholder
eaten as an HTML tag, each default said once, no code block scrolling sideways in a real browser), and
the README stays a short entry whose links all lead somewhere."""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from testing.browser import CHROMIUM, headless
from testing.reference_pages import REFERENCE, ROOT, pages
from testing.tutorials import on_port, shell_blocks

README = ROOT / "README.md"
README_MAX_LINES = 250
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `./dev docs` builds it (strictly), once for the module."""
    out = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


class _Cells(HTMLParser):
    """The text of every table cell of a page, as a reader sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("td", "th"):
            self._depth += 1
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth:
            self.cells[-1] += data


def _cells(page: Path) -> list[str]:
    parser = _Cells()
    parser.feed(page.read_text())
    return parser.cells


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if "search" not in p.parts)


@pytest.mark.parametrize("name", sorted(pages()))
def test_each_reference_page_is_what_the_code_generates(name: str) -> None:
    on_disk = REFERENCE / name
    assert on_disk.exists(), f"docs/reference/{name} is missing: run `python -m testing.reference_pages`"
    assert on_disk.read_text() == pages()[name], (
        f"docs/reference/{name} is stale: run `python -m testing.reference_pages`"
    )


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "reference" / "cli" / "index.html").exists()


def test_no_table_cell_shows_a_backslash_before_a_pipe(site: Path) -> None:
    """A `\\|` inside a code span is shown as typed (Python-Markdown splits no code span); outside one it
    reads `|`."""
    shown = [(p.relative_to(site).parent, c[:80]) for p in _pages(site) for c in _cells(p) if "\\|" in c]
    assert not shown


def test_no_table_row_of_the_sources_has_a_pipe_in_a_code_span() -> None:
    """GitHub splits a table cell at a code span's `|`, the site shows its `\\|`: neither reads right."""
    rows = [
        (page.relative_to(ROOT), line[:80])
        for page in DOCS.rglob("*.md")
        for line in page.read_text().splitlines()
        if line.startswith("|") and any("|" in span for span in re.findall(r"`[^`]*`", line))
    ]
    assert not rows


def _placeholders(markdown: str) -> set[str]:
    """The `<word>`s a page's text says outside code spans (`CACHE_SERVER_<OPTION>`, `<host>-<pid>`)."""
    prose = re.sub(r"`[^`]*`", "", html.unescape(markdown))
    return set(re.findall(r"<[A-Za-z][^<>`]*>", prose))


def test_the_command_line_page_shows_the_placeholders_of_its_help_texts(site: Path) -> None:
    said = _placeholders(pages()["cli.md"])
    assert {"<OPTION>", "<host>", "<checkpoint name>"} <= said
    shown = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "cli" / "index.html").read_text()))
    assert not [p for p in said if p not in shown], "a placeholder read as an HTML tag vanished"


def _actions(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.Action]]:
    """(`prog`, action) for every option of every command, nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        elif action.help not in (None, argparse.SUPPRESS):
            yield parser.prog, action


def test_each_option_says_its_default_once_in_help_and_on_the_page(site: Path) -> None:
    from cache_server.cli import _parser as server_parser
    from eval_worker.cli import _parser as worker_parser

    helps = [(prog, a.help or "") for p in (server_parser(), worker_parser()) for prog, a in _actions(p)]
    assert len(helps) > 100
    twice = [h for _, h in helps if h.count("(default") > 1 or "(default: None)" in h]
    assert not twice, twice[:5]
    cells = _cells(site / "reference" / "cli" / "index.html")
    doubled = [c for c in cells if c.count("(default") > 1 or "(default: None)" in c]
    stated = [c for c in cells if re.search(r"\((\d+)\) \(default: \1(\.0)?\)", c)]  # `(10) (default: 10.0)`
    assert not doubled and not stated, (doubled + stated)[:5]


CODE_OVERFLOW_CHECK = """<!doctype html><body><script>
const pages = %s, found = [];
let left = pages.length;
for (const page of pages) {
  const frame = document.createElement("iframe");
  frame.style.width = "1280px";
  frame.style.height = "800px";
  frame.onload = () => {
    for (const code of frame.contentDocument.querySelectorAll("pre > code")) {
      if (code.scrollWidth > code.clientWidth + 1) found.push(page + ": " + code.textContent.slice(0, 60));
    }
    if (--left === 0) {
      const out = document.createElement("pre");
      out.id = "overflowing";
      out.textContent = JSON.stringify({checked: pages.length, found});
      document.body.appendChild(out);
    }
  };
  frame.src = page;
  document.body.appendChild(frame);
}
</script></body>"""


@contextmanager
def _served(root: Path) -> Iterator[str]:
    """`root` served over HTTP on loopback (the browser reads the pages' frames only from one origin)."""
    handler = partial(_QuietHandler, directory=str(root))
    with ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the requests are not the test's output
        pass


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it with apt-get)")
def test_no_code_block_scrolls_sideways_at_a_laptops_width(site: Path) -> None:
    """Every page in a 1280-pixel frame, in one Chromium start: a code block wider than the page would
    hide its end (a trailing comment) behind a scroll bar."""
    paths = [f"/{p.parent.relative_to(site).as_posix()}/".replace("/./", "/") for p in _pages(site)]
    (site / "overflow-check.html").write_text(CODE_OVERFLOW_CHECK % json.dumps(paths))
    with _served(site) as url:
        dom = headless(f"{url}/overflow-check.html", "--dump-dom")
    match = re.search(r'<pre id="overflowing">(.*?)</pre>', dom, re.S)
    assert match, "the check did not finish loading every page"
    result = json.loads(html.unescape(match.group(1)))
    assert result["checked"] == len(paths) > 15
    assert not result["found"], result["found"]


@pytest.mark.parametrize("page", sorted((DOCS / "tutorials").glob("*.md")), ids=lambda p: p.name)
def test_each_tutorial_is_blocks_its_test_can_run(page: Path) -> None:
    """The quick side of `tests/test_tutorials.py`: every marker is on a bash block, the server starts in
    the background before anything asks it, and every port is one the test can move."""
    blocks = shell_blocks(page)
    hows = [b.how for b in blocks if b.how != "skip"]
    assert hows.count("background") == 1 and hows.index("background") <= 1 and hows.count("run") >= 3
    assert all(on_port(b.text, 1) for b in blocks if b.how != "skip")


def test_a_tutorial_marker_off_a_bash_block_is_refused(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- tutorial: background -->\n```text\nserve\n```\n")
    with pytest.raises(ValueError, match="not followed by a bash block"):
        shell_blocks(page)


def test_the_readme_is_an_entry_not_the_manual() -> None:
    assert len(README.read_text().splitlines()) <= README_MAX_LINES


def test_every_relative_link_of_the_readme_leads_to_a_file() -> None:
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    relative = [link for link in links if not link.startswith(("http://", "https://"))]
    assert relative, "the README links its pages"
    assert not [link for link in relative if not (ROOT / link).exists()]
