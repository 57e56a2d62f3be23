"""A connector that delays a file's write: for the first prompt starting with token id 6 (per directory)
it waits `DELAY_S` after the engine has answered the request and before it writes the file, leaving
`slow-write.started` in the directory to say so; a test kills the engine in that window, as a crash
between the answer and the write (on GPU, an out-of-memory one during the asynchronous copy) would.
It also writes the wrong tokens of `hsc_wrong_tokens_connector`, so that one engine runs both faults."""

from __future__ import annotations

import os
import time

import torch
from hsc_wrong_tokens_connector import WrongTokensConnector

MARKER = 6
DELAY_S = 120.0  # longer than any test waits: the engine is killed first
STARTED = "slow-write.started"


class SlowWriteConnector(WrongTokensConnector):  # type: ignore[misc]
    """`WrongTokensConnector` that delays the first write of a prompt whose first id is `MARKER`."""

    def _save(self, tensors: dict[str, torch.Tensor], filename: str, lock_fd: int | None) -> None:
        ids = tensors["token_ids"]
        if ids.numel() and int(ids[0]) == MARKER and self._first_delay():
            time.sleep(DELAY_S)
        super()._save(tensors, filename, lock_fd)

    def _first_delay(self) -> bool:
        """Whether this is the directory's first delayed write (`STARTED` created now), so that an
        engine started again after the kill writes at once."""
        try:
            os.close(os.open(os.path.join(self._storage_path, STARTED), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True
