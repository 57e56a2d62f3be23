"""What `eval-worker` exits with."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit status of every `eval-worker` command."""

    ok = 0
    usage = 1  # bad options, no CUDA for --device cuda, nothing to do
    refused = 2  # the checkpoint is unusable or does not fit the target
    unreachable = 3  # the cache server cannot be reached
    server = 4  # the server refused the request or served data that does not fit
    job_failed = 5  # `submit --wait`: the job failed
