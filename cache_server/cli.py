"""`cache-server tiny-model DIR ...` and `cache-server serve ...`; options fall back to CACHE_SERVER_*."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

if TYPE_CHECKING:
    from cache_server.settings import ServeSettings


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """Only the options given on the command line, so that the environment fills the rest."""
    return {n: getattr(args, n) for n in names if getattr(args, n) is not None}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cache-server",
        description="Run a target LLM once per prompt, cache its hidden states, serve any layer set.",
        epilog="Every option can also be set in the environment as CACHE_SERVER_<OPTION>.",
    )
    sub = p.add_subparsers(dest="command", required=True)

    tiny = sub.add_parser("tiny-model", help="write a small random Qwen3-architecture target with a tokenizer")
    tiny.add_argument("dir", type=Path)
    tiny.add_argument("--layers", type=int)
    tiny.add_argument("--hidden", type=int)
    tiny.add_argument("--vocab", type=int)
    tiny.add_argument("--seed", type=int)

    serve = sub.add_parser("serve", help="serve hidden states over HTTP")
    serve.add_argument("--model", type=Path, help="Hugging Face model directory of the target")
    serve.add_argument("--store", type=Path, help="directory of the Zarr hidden-state store")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="default 8000")
    serve.add_argument("--device", choices=["auto", "cpu", "cuda"], help="default auto")
    serve.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], help="default bf16 on GPU, fp32 on CPU")
    serve.add_argument("--capture-layers", dest="capture_layers", help="'all' (default) or e.g. 1,16,31,46,61")
    serve.add_argument("--batch-tokens", dest="batch_tokens", type=int, help="tokens per batched forward (8192)")
    serve.add_argument("--wait-s", dest="wait_s", type=float, help="how long GET /hidden waits (30)")
    serve.add_argument("--log-level", dest="log_level", help="default info")
    serve.add_argument(
        "--checkpoint-root",
        dest="checkpoint_root",
        type=Path,
        help="directory whose checkpoints POST /jobs may evaluate (default: jobs refused)",
    )
    serve.add_argument("--token", help="bearer token required on writes (prefer CACHE_SERVER_TOKEN: ps shows argv)")
    serve.add_argument(
        "--job-max-attempts", dest="job_max_attempts", type=int, help="claims per job before it fails (3)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from cache_server.settings import ServeSettings, TinyModelSettings

    try:
        if args.command == "tiny-model":
            from cache_server.tiny_model import build_tiny_model

            tiny = TinyModelSettings(**_given(args, "layers", "hidden", "vocab", "seed"))
            out = build_tiny_model(args.dir, layers=tiny.layers, hidden=tiny.hidden, vocab=tiny.vocab, seed=tiny.seed)
            shape = f"{tiny.layers} layers, hidden {tiny.hidden}, vocab {tiny.vocab}"
            print(f"wrote a tiny Qwen3 target ({shape}) to {out}")
            return 0
        settings = ServeSettings(
            **_given(
                args,
                "model",
                "store",
                "host",
                "port",
                "device",
                "dtype",
                "capture_layers",
                "batch_tokens",
                "wait_s",
                "log_level",
                "checkpoint_root",
                "token",
                "job_max_attempts",
            )
        )
        _check_startable(settings)
    except (ValidationError, ValueError) as e:
        print(f"cache-server: {e}", file=sys.stderr)
        return 2
    return _serve(settings)


def _check_startable(settings: ServeSettings) -> None:
    """Fail before the server starts, with one line, on what would otherwise be a startup traceback."""
    from cache_server.devices import resolve_device

    if not (settings.model / "config.json").is_file():
        raise ValueError(f"--model {settings.model} is not a Hugging Face model directory (no config.json)")
    resolve_device(settings.device)


def _serve(settings: ServeSettings) -> int:
    import uvicorn

    from cache_server.app import create_app

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        loop="auto",  # uvloop when installed: it serves large bodies ~2x faster than asyncio
        http="auto",  # httptools when installed: h11 copies every response body once more
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
