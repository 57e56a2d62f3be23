"""The layout's promises, checked in fresh interpreters: the client and the wire contract stay light,
the eval worker never loads the server side, and every module and public function is documented (the
size of functions is ruff's to check: C901 and PLR0912/0913/0915 in pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from testing.imports import modules_loaded

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cache_server", "eval_worker", "schemas", "testing")
HEAVY = {"torch", "transformers", "zarr", "fastapi", "uvicorn", "matplotlib", "starlette", "numcodecs"}
SERVER_SIDE = (
    "cache_server.capture",
    "cache_server.generation",
    "cache_server.store",
    "cache_server.compute",
    "cache_server.api",
    "cache_server.jobs",
    "cache_server.cli",
    "cache_server.settings",
)


def _modules(package: str) -> list[str]:
    base = ROOT / package
    return sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in base.rglob("*.py")
    )


def _loaded_after(imports: list[str]) -> set[str]:
    """The modules `sys.modules` holds after importing `imports` in a fresh interpreter."""
    return modules_loaded("import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in imports))


def _server_side(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == s or m.startswith(s + ".") for s in SERVER_SIDE))


def _top(modules: set[str]) -> set[str]:
    return {m.partition(".")[0] for m in modules}


TORCH_SIDE = ("cache_server.client.torch_dataset", "cache_server.client.speculators_dataset")  # imported only by name


# Imports speculators, which only the peers' environment has (the peers' tests load it there).
PEERS_SIDE = ("cache_server.client.speculators_dataset",)


def test_the_client_is_light() -> None:
    light = [m for m in _modules("cache_server/client") if m not in TORCH_SIDE]
    loaded = _loaded_after(["cache_server.client", *light])
    assert not _top(loaded) & HEAVY, sorted(_top(loaded) & HEAVY)
    assert not _server_side(loaded)
    assert not set(TORCH_SIDE) & loaded


def test_the_clients_torch_side_loads_no_server_side() -> None:
    loaded = _loaded_after([m for m in TORCH_SIDE if m not in PEERS_SIDE])
    assert not _server_side(loaded)
    assert not _top(loaded) & {"transformers", "zarr", "fastapi", "uvicorn", "starlette"}


def test_schemas_import_no_torch() -> None:
    loaded = _loaded_after(_modules("schemas"))
    assert not _top(loaded) & HEAVY, sorted(_top(loaded) & HEAVY)
    assert not [m for m in loaded if m.startswith(("cache_server", "eval_worker"))]


def test_the_eval_worker_never_imports_the_server_side() -> None:
    loaded = _loaded_after(_modules("eval_worker"))
    assert not _server_side(loaded)
    assert not _top(loaded) & {"transformers", "zarr", "fastapi", "uvicorn", "starlette", "numcodecs"}


@pytest.mark.parametrize("cli", ["cache_server.cli", "eval_worker.cli"])
def test_command_lines_load_no_torch_before_a_command_runs(cli: str) -> None:
    loaded = _loaded_after([cli])
    assert not _top(loaded) & (HEAVY | {"numpy", "httpx"}), sorted(_top(loaded) & (HEAVY | {"numpy", "httpx"}))


def test_the_light_commands_need_no_torch() -> None:
    """`submit`, `watch` and `compare` (without --plot) run on the base install."""
    light = [
        "eval_worker.commands",
        "eval_worker.reports.compare",
        "eval_worker.reports.table",
        "eval_worker.worker.watch",
    ]
    loaded = _loaded_after(["eval_worker.cli", "cache_server.client", *light])
    assert not _top(loaded) & HEAVY, sorted(_top(loaded) & HEAVY)


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_public_classes_and_functions_say_what_they_are(path: Path) -> None:
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), "module docstring"
    missing = []
    nodes = [n for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    for node in nodes:
        if node.name.startswith("_"):
            continue
        if ast.get_docstring(node) is None:
            missing.append(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                public = not item.name.startswith("_") if isinstance(item, ast.FunctionDef) else False
                if public and ast.get_docstring(item) is None:  # type: ignore[arg-type]
                    missing.append(f"{node.name}.{item.name}")  # type: ignore[union-attr]
    assert not missing, f"no docstring: {missing}"


@pytest.mark.parametrize(
    "package", sorted(str(p.parent.relative_to(ROOT)) for name in PACKAGES for p in (ROOT / name).rglob("__init__.py"))
)
def test_each_package_docstring_names_every_module_in_it(package: str) -> None:
    """A reader starts at the package docstring: it names each of its modules and subpackages."""
    base = ROOT / package
    doc = ast.get_docstring(ast.parse((base / "__init__.py").read_text())) or ""
    names = [p.name for p in base.glob("*.py") if p.name != "__init__.py"]
    names += [f"{p.name}/" for p in base.iterdir() if (p / "__init__.py").is_file()]
    assert not [n for n in sorted(names) if f"`{n}`" not in doc], f"{package}/__init__.py does not name them"


# Where a drafter family may be named by its classes: its own files, and the one table of families.
FAMILY_FILES = {
    "eval_worker/families/__init__.py",
    "eval_worker/drafters/layers.py",
    "eval_worker/checkpoints/loaded_checkpoint.py",
}
FAMILY_FOLDERS = ("eval_worker/families/",)  # each family's own folder
FAMILY_CLASSES = ("DFlashDrafter", "DFlashConfig", "Eagle3Drafter", "Eagle3Config", "MtpDrafter")
FAMILY_NAMES = ("dflash", "eagle3", "mtp")


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_drafter_families_are_told_apart_only_in_their_table(path: Path) -> None:
    """Outside a family's own folder, code asks the table (`families/__init__.py`), never `isinstance` or
    the family's name (reports format the wire's `drafter_family` field, without torch)."""
    name = str(path.relative_to(ROOT))
    if name in FAMILY_FILES or name.startswith(FAMILY_FOLDERS) or not name.startswith("eval_worker/"):
        return
    if name.startswith("eval_worker/reports/"):  # they format the wire's `drafter_family`
        return
    told_apart = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            told_apart += [n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name) and n.id in FAMILY_CLASSES]
        if isinstance(node, ast.Compare) and any(
            isinstance(c, ast.Constant) and c.value in FAMILY_NAMES for c in [node.left, *node.comparators]
        ):
            told_apart.append(ast.unparse(node))
    assert not told_apart, f"{path.name} tells drafter families apart itself: {told_apart}"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "eval_worker" / "families").glob("*/*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_a_family_folder_imports_neither_the_table_nor_another_family(path: Path) -> None:
    """A family is its folder: it imports what all families share, never the table above it or a sibling."""
    own = f"eval_worker.families.{path.parent.name}"
    imported = [n.module or "" for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Import) for a in n.names]
    upward = [m for m in imported if m.startswith("eval_worker.families") and not m.startswith(own)]
    assert not upward, f"{path.relative_to(ROOT)} imports {upward}"


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules `path` imports anywhere in it (module level, `TYPE_CHECKING` or a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found |= {m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in modules}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
    return found


def test_no_module_imports_one_that_imports_it_back() -> None:
    """No import cycles between modules, lazy or type-only ones included: each concept stands on the
    ones below it (a cycle says two modules are one concept, or a third is missing)."""
    modules = {".".join(p.with_suffix("").parts[len(ROOT.parts) :]).removesuffix(".__init__"): p for p in _sources()}
    graph = {m: _imports(p, modules) - {m} for m, p in modules.items()}
    cycles = []
    for start in graph:
        stack, seen = [(start, (start,))], set()
        while stack:
            module, path = stack.pop()
            for dep in graph[module]:
                if dep == start:
                    cycles.append(" -> ".join((*path, start)))
                elif dep not in seen:
                    seen.add(dep)
                    stack.append((dep, (*path, dep)))
    assert not cycles, cycles[:5]


# What a test module starts, by the `testing` module it imports, and the marker that says so (the quick
# tier, `./dev test --quick`, leaves these out).
RESOURCE_MARKERS = {"testing.engine": "engine", "testing.docker": "docker", "testing.browser": "browser"}
RESOURCE_MARKERS |= {"testing.peers": "peers"}


@pytest.mark.parametrize("path", sorted((ROOT / "tests").rglob("test_*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_test_that_starts_an_engine_docker_or_a_browser_is_marked_so(path: Path) -> None:
    """A module importing what starts vLLM, Docker, Chromium or the peers' environment names that marker."""
    tree = ast.parse(path.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    marks = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and ast.unparse(n.value) == "pytest.mark"}
    missing = {m for module, m in RESOURCE_MARKERS.items() if module in imported} - marks
    assert not missing, f"{path.relative_to(ROOT)} starts what needs pytest.mark.{sorted(missing)}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_formatter_is_skipped_only_for_tables(path: Path) -> None:
    """`# fmt: skip` keeps a table's rows aligned; it never squeezes code under the line cap."""
    skipped = [line.strip() for line in path.read_text().splitlines() if "# fmt: skip" in line]
    assert all(line.split("#")[0].strip() in ("}", "]", ")]") for line in skipped), skipped
