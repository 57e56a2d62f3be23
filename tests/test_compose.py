"""docker-compose.yml and services/Dockerfile cannot rot: every name they use exists in the code.

No Docker engine runs here, so the files are parsed and checked against the settings classes, the
console scripts, the CLI parsers and the deployment page's variable table; `${...}` is resolved as Compose does.
"""

from __future__ import annotations

import importlib
import json
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic_settings import BaseSettings

from cache_server.settings import ServeSettings
from eval_worker.settings import WorkerSettings

ROOT = Path(__file__).resolve().parent.parent
SERVER, WORKER = "cache-server", "eval-worker"
SETTINGS: dict[str, tuple[str, type[BaseSettings]]] = {
    SERVER: ("CACHE_SERVER_", ServeSettings),
    WORKER: ("EVAL_WORKER_", WorkerSettings),
}
SAMPLE_ENV = {"TARGET_MODEL_DIR": "/models/qwen3", "HIDDEN_STORE_DIR": "/nvme/store", "CHECKPOINT_DIR": "/runs"}

# `$$`, or `${NAME}` with an optional `:-default`, `-default`, `:?message`, `?message`, `:+alt`, `+alt`.
_INTERPOLATION = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")


class MissingVariable(Exception):
    """A `${VAR:?message}` whose variable is unset: `docker compose config` fails with the message."""


def _interpolate(value: str, env: Mapping[str, str]) -> str:
    if "$" in _INTERPOLATION.sub("", value):
        raise ValueError(f"{value!r} holds a `$` that is not `$$` or `${{...}}`")

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m["name"], m["op"] or "", m["arg"] or ""
        value = env.get(name)
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("?") and unset:
            raise MissingVariable(f"{name}: {arg}")
        if op.endswith("-") and unset:
            return arg
        if op.endswith("+"):
            return "" if unset else arg
        return value or ""

    return _INTERPOLATION.sub(one, value)


def _resolve(node: Any, env: Mapping[str, str]) -> Any:
    """Compose interpolates values after parsing, never keys or comments."""
    if isinstance(node, dict):
        return {k: _resolve(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, env) for v in node]
    return _interpolate(node, env) if isinstance(node, str) else node


def _strings(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for v in node.values():
            yield from _strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v)
    elif isinstance(node, str):
        yield node


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def compose(raw: dict[str, Any]) -> dict[str, Any]:
    return _resolve(raw, SAMPLE_ENV)


def _interpolations(raw: dict[str, Any]) -> list[re.Match[str]]:
    return [m for s in _strings(raw) for m in _INTERPOLATION.finditer(s) if m["name"]]


def _mounts(service: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """Container path -> (source, read-only), from the short `source:target[:mode]` syntax."""
    out = {}
    for spec in service.get("volumes", []):
        source, target, *mode = spec.split(":")
        out[target] = (source, mode == ["ro"])
    return out


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, f"not a compose duration: {duration!r}"
    return sum(float(n) * units[u] for n, u in parts)


# -- interpolation -------------------------------------------------------------------------------


def test_interpolation_uses_only_required_or_defaulted_variables(raw: dict[str, Any]) -> None:
    matches = _interpolations(raw)
    assert matches
    for m in matches:
        assert m["op"] in (":?", ":-"), f"{m[0]}: use ${{VAR:?message}} or ${{VAR:-default}}"
        if m["op"] == ":?":
            assert m["arg"].strip(), f"{m[0]}: a required variable needs a message saying what to set"


def test_resolves_with_only_the_required_variables(compose: dict[str, Any]) -> None:
    assert "$" not in "".join(_strings(compose))
    assert int(compose["services"][WORKER]["deploy"]["replicas"]) == 2


@pytest.mark.parametrize("missing", sorted(SAMPLE_ENV))
def test_each_required_variable_is_demanded(raw: dict[str, Any], missing: str) -> None:
    env = {k: v for k, v in SAMPLE_ENV.items() if k != missing}
    with pytest.raises(MissingVariable, match=missing):
        _resolve(raw, env)
    with pytest.raises(MissingVariable, match=missing):
        _resolve(raw, {**env, missing: ""})


def test_every_variable_is_in_the_deployment_pages_table(raw: dict[str, Any]) -> None:
    page = (ROOT / "docs" / "deployment.md").read_text()
    _, found, section = page.partition("\n## Deploy on a GPU node\n")
    assert found, "docs/deployment.md lacks the '## Deploy on a GPU node' section"
    section = section.split("\n## ")[0]
    table = set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|", section, flags=re.MULTILINE))
    passed_through = {
        name for s in raw["services"].values() for name, v in (s.get("environment") or {}).items() if v is None
    }
    used = {m["name"] for m in _interpolations(raw)} | passed_through
    assert used - table == set(), "variables missing from the deployment page's table"
    assert table - used == set(), "deployment page table rows for variables the compose file no longer uses"


# -- services against the code -------------------------------------------------------------------


SCALE_OUT, ENGINE = "scale-out", "engine"
AWS_PASS_THROUGH = {"AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}


def _scale_out_servers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if n.startswith(f"{SERVER}-gpu")}


def test_services_are_the_two_processes_and_the_scale_out_profile(compose: dict[str, Any]) -> None:
    services = compose["services"]
    default = {n for n, s in services.items() if "profiles" not in s}
    assert default == set(SETTINGS)
    profiled = set(services) - default
    capture = {"vllm-capture", "cache-server-engine"}
    assert profiled == {*_scale_out_servers(compose), "postgres", "vllm", *capture} and len(profiled) >= 6
    profile = {"vllm": ENGINE} | dict.fromkeys(capture, "engine-capture")
    assert all(services[n]["profiles"] == [profile.get(n, SCALE_OUT)] for n in profiled)


def test_scale_out_servers_each_have_a_gpu_a_name_and_a_port_and_wait_for_postgres(compose: dict[str, Any]) -> None:
    services = compose["services"]
    servers = {SERVER: services[SERVER], **_scale_out_servers(compose)}
    devices = [s["deploy"]["resources"]["reservations"]["devices"][0] for s in _scale_out_servers(compose).values()]
    assert sorted(d["device_ids"] for d in devices) == [[str(i)] for i in range(1, len(devices) + 1)]
    names = [s["environment"]["CACHE_SERVER_INSTANCE"] for s in servers.values()]
    ports = [s["ports"][0].rsplit(":", 2)[1] for s in servers.values()]
    assert len(set(names)) == len(set(ports)) == len(servers)
    own = ("environment", "ports", "deploy", "profiles", "depends_on")  # what a server's GPU and name set apart
    for name, server in servers.items():
        shared = {k: v for k, v in server.items() if k not in own}
        assert shared == {k: v for k, v in services[SERVER].items() if k not in own}, f"{name} differs from {SERVER}"
        assert server["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert {k: v for k, v in server["environment"].items() if k != "CACHE_SERVER_INSTANCE"} == {
            k: v for k, v in services[SERVER]["environment"].items() if k != "CACHE_SERVER_INSTANCE"
        }
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]


def test_engine_profile_serves_the_targets_directory_where_the_server_points(raw: dict[str, Any]) -> None:
    env = {**SAMPLE_ENV, "CACHE_SERVER_GENERATOR": "http://vllm:8000"}
    services = _resolve(raw, env)["services"]
    engine, server = services["vllm"], services[SERVER]
    assert ":" in engine["image"] and not engine["image"].endswith(":latest"), "pin the engine image"
    args = dict(a.removeprefix("--").split("=", 1) for a in engine["command"])
    model_mount = server["environment"]["CACHE_SERVER_MODEL"]
    assert _mounts(engine)[args["model"]] == _mounts(server)[model_mount] == (SAMPLE_ENV["TARGET_MODEL_DIR"], True)
    assert 0 < float(args["gpu-memory-utilization"]) < 1  # the rest of the GPU is the cache server's
    assert args["dtype"] == server["environment"]["CACHE_SERVER_DTYPE"]
    generator = urlsplit(server["environment"]["CACHE_SERVER_GENERATOR"])
    assert (generator.hostname, generator.port) == ("vllm", int(args["port"])) and args["host"] == "0.0.0.0"
    assert server["depends_on"]["vllm"] == {"condition": "service_healthy", "required": False}
    [url] = re.findall(r"https?://[^'\"\s)]+", " ".join(engine["healthcheck"]["test"]))
    assert urlsplit(url).path == "/health" and urlsplit(url).port == int(args["port"])
    ServeSettings(model=Path("/m"), store="/s", generator=server["environment"]["CACHE_SERVER_GENERATOR"])
    assert services[SERVER]["environment"]["CACHE_SERVER_GENERATOR"] == "http://vllm:8000"
    assert _resolve(raw, SAMPLE_ENV)["services"][SERVER]["environment"]["CACHE_SERVER_GENERATOR"] == "hf"


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_build_context_and_dockerfile_exist(compose: dict[str, Any], name: str) -> None:
    build = compose["services"][name]["build"]
    context = ROOT / build["context"]
    assert context.is_dir()
    assert (context / build["dockerfile"]).is_file()


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_environment_names_are_settings_fields(compose: dict[str, Any], name: str) -> None:
    prefix, settings = SETTINGS[name]
    env = compose["services"][name]["environment"]
    assert isinstance(env, dict), "use the mapping form of `environment`"
    for var in env:
        if name == SERVER and var in AWS_PASS_THROUGH:
            assert env[var] is None, f"{var} is passed through from the host, not set here"
            continue
        assert var.startswith(prefix), f"{name} sets {var}, which {settings.__name__} never reads"
        field = var.removeprefix(prefix).lower()
        assert field in settings.model_fields, f"{var}: {settings.__name__} has no field {field!r}"


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_environment_values_validate(compose: dict[str, Any], name: str, tmp_path: Path) -> None:
    """The settings class accepts what the service sets (paths that must exist are swapped for tmp)."""
    prefix, settings = SETTINGS[name]
    env = compose["services"][name]["environment"]
    given = {k.removeprefix(prefix).lower(): v for k, v in env.items() if k.startswith(prefix)}
    required = {f for f, info in settings.model_fields.items() if info.is_required()}
    assert required <= given.keys(), f"{name} leaves required settings unset"
    given = {f: v for f, v in given.items() if v is not None}  # passed through from the host
    if "checkpoint_root" in given:
        given["checkpoint_root"] = str(tmp_path)
    settings(**given)


def test_setting_paths_are_mounted(compose: dict[str, Any]) -> None:
    server, worker = compose["services"][SERVER], compose["services"][WORKER]
    server_mounts, worker_mounts = _mounts(server), _mounts(worker)
    env = server["environment"]
    assert server_mounts[env["CACHE_SERVER_MODEL"]] == (SAMPLE_ENV["TARGET_MODEL_DIR"], True)
    assert server_mounts[env["CACHE_SERVER_STORE"]] == (SAMPLE_ENV["HIDDEN_STORE_DIR"], False)
    assert worker["environment"]["EVAL_WORKER_HEADS_CACHE"] in worker_mounts
    # Jobs carry the server's resolved checkpoint path: the workers must see the same tree there.
    root = env["CACHE_SERVER_CHECKPOINT_ROOT"]
    assert server_mounts[root] == worker_mounts[root] == (SAMPLE_ENV["CHECKPOINT_DIR"], True)


def test_named_volumes_are_declared(compose: dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    for name, service in compose["services"].items():
        for source, _ in _mounts(service).values():
            if not source.startswith(("/", ".", "~")):
                assert source in declared, f"{name} mounts undeclared volume {source!r}"


def test_server_listens_everywhere_but_publishes_on_loopback(compose: dict[str, Any]) -> None:
    server = compose["services"][SERVER]
    assert server["environment"]["CACHE_SERVER_HOST"] == "0.0.0.0"
    [published] = server["ports"]
    host, host_port, container_port = published.split(":")
    assert host == "127.0.0.1" and int(host_port) > 0
    assert int(container_port) == int(server["environment"]["CACHE_SERVER_PORT"])


def test_healthcheck_hits_healthz_on_the_served_port(compose: dict[str, Any]) -> None:
    server = compose["services"][SERVER]
    check = server["healthcheck"]
    assert check["test"][0] == "CMD" and check["test"][1] == "python", "no curl in the image: use python"
    [url] = re.findall(r"https?://[^'\"\s)]+", " ".join(check["test"]))
    parts = urlsplit(url)
    assert parts.hostname in ("127.0.0.1", "localhost") and parts.path == "/healthz"
    assert parts.port == int(server["environment"]["CACHE_SERVER_PORT"])
    assert _seconds(check["start_period"]) >= 120, "loading a large target takes minutes"
    assert 5 <= _seconds(check["interval"]) <= 60 and _seconds(check["timeout"]) <= _seconds(check["interval"])


def test_worker_calls_the_server_by_service_name(compose: dict[str, Any]) -> None:
    worker, server = compose["services"][WORKER], compose["services"][SERVER]
    url = urlsplit(worker["environment"]["EVAL_WORKER_SERVER"])
    assert url.hostname == SERVER
    assert url.port == int(server["environment"]["CACHE_SERVER_PORT"])
    assert worker["depends_on"] == {SERVER: {"condition": "service_healthy"}}


def test_worker_token_is_the_server_token(raw: dict[str, Any]) -> None:
    services = raw["services"]
    assert "CACHE_SERVER_TOKEN" in services[SERVER]["environment"]
    assert services[WORKER]["environment"]["EVAL_WORKER_TOKEN"].startswith("${CACHE_SERVER_TOKEN:-")


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_gpu_is_reserved(compose: dict[str, Any], name: str) -> None:
    devices = compose["services"][name]["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]} in devices


# -- Dockerfiles ---------------------------------------------------------------------------------


_STAGE = re.compile(r"^FROM\s+(?P<image>\S+)(?:\s+AS\s+(?P<name>\S+))?\s*$", flags=re.MULTILINE | re.IGNORECASE)


def _dockerfile(compose: dict[str, Any], name: str) -> str:
    """The lines of the build target of service `name` and of the stages it builds on, base first."""
    build = compose["services"][name]["build"]
    text = (ROOT / build["context"] / build["dockerfile"]).read_text()
    starts = list(_STAGE.finditer(text))
    stages = {
        m["name"]: (m["image"], text[m.start() : nxt.start() if nxt else len(text)])
        for m, nxt in zip(starts, [*starts[1:], None], strict=True)
    }
    chain, stage = [], build["target"]
    while stage in stages:
        image, body = stages[stage]
        chain.insert(0, body)
        stage = image
    assert chain, f"build target {build['target']!r} is not a stage of {build['dockerfile']}"
    return "".join(chain)


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_entrypoint_is_a_console_script_subcommand(compose: dict[str, Any], name: str) -> None:
    dockerfile = _dockerfile(compose, name)
    [entry] = re.findall(r"^ENTRYPOINT\s+(\[.*\])\s*$", dockerfile, flags=re.MULTILINE)
    script, *argv = json.loads(entry)  # exec form: signals reach the process, no shell in between
    assert script == name
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert script in scripts, f"{script} is not in [project.scripts]"
    module = importlib.import_module(scripts[script].split(":")[0])
    args = module._parser().parse_args(argv)  # exits (SystemExit) on a sub-command it does not know
    assert args.command == argv[0] == "serve"


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_image_is_pinned_and_runs_unprivileged(compose: dict[str, Any], name: str) -> None:
    dockerfile = _dockerfile(compose, name)
    base = re.findall(r"^FROM\s+(\S+)", dockerfile, flags=re.MULTILINE)[0]
    if base == "${BASE_IMAGE}":  # the build argument's default: what a GPU node builds on
        text = (ROOT / compose["services"][name]["build"]["context"] / "services" / "Dockerfile").read_text()
        [base] = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, flags=re.MULTILINE)
    tag = base.partition(":")[2]
    assert tag and tag != "latest" and "cuda" in tag, f"pin a CUDA base image, not {base!r}"
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^ && pip install .*\s\.(\s|$)", dockerfile, flags=re.MULTILINE), "install with `pip install .`"
    assert "[dev]" not in dockerfile


@pytest.mark.parametrize(("name", "extra"), [(SERVER, "server"), (WORKER, "worker")])
def test_image_installs_the_base_and_its_extra(compose: dict[str, Any], name: str, extra: str) -> None:
    dockerfile = _dockerfile(compose, name)
    assert re.search(r"\[\"dependencies\"\] \+ .*\[\"optional-dependencies\"\]\[e\].*\$EXTRAS", dockerfile, re.DOTALL)
    assert compose["services"][name]["build"]["args"]["EXTRAS"].split()[0] == extra
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {
        re.split(r"[<>=!;\[ ]", r)[0].lower() for r in project["dependencies"] + project["optional-dependencies"][extra]
    }
    if extra == "worker":  # the worker image carries none of the server's stack
        assert not wanted & {"transformers", "zarr", "fastapi", "uvicorn", "matplotlib"}


def test_server_image_exposes_the_served_port(compose: dict[str, Any]) -> None:
    exposed = re.findall(r"^EXPOSE\s+(\d+)", _dockerfile(compose, SERVER), flags=re.MULTILINE)
    assert exposed == [compose["services"][SERVER]["environment"]["CACHE_SERVER_PORT"]]


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".git", ".venv*", "demo-out"} <= ignored  # .venv* also holds .venv-vllm and .venv-peers


def test_mount_targets_are_absolute(compose: dict[str, Any]) -> None:
    for service in compose["services"].values():
        assert all(PurePosixPath(t).is_absolute() for t in _mounts(service))
