"""What `eval-worker` exits with."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit status of every `eval-worker` command; 2 is a usage error, as argparse (and `cache-server`) exit."""

    ok = 0
    disagrees = 1  # `parity`: a prompt's live rounds are not its offline rounds
    usage = 2  # bad options, no CUDA for --device cuda, nothing to do
    refused = 3  # the checkpoint is unusable or does not fit the target
    unreachable = 4  # the cache server cannot be reached
    server = 5  # the server refused the request or served data that does not fit
    job_failed = 6  # `submit --wait`: the job failed
    engine = 7  # `parity`: the engine is unreachable, serves another model or no speculative config
    not_lossless = 7  # `parity` at T > 0: the probe found the engine's speculative sampling lossy (unfit too)


MEANINGS = {
    ExitCode.ok: "ok",
    ExitCode.disagrees: "parity: a prompt disagrees",
    ExitCode.usage: "bad usage",
    ExitCode.refused: "checkpoint refused",
    ExitCode.unreachable: "server unreachable",
    ExitCode.server: "server error or mismatched data",
    ExitCode.job_failed: "job failed",
    ExitCode.engine: "engine unfit for parity (or not lossless at T > 0)",
}


def exit_codes_line() -> str:
    """Every exit status and what it means, for `--help`."""
    return "Exit codes: " + ", ".join(f"{int(code)} {MEANINGS[code]}" for code in ExitCode) + "."
