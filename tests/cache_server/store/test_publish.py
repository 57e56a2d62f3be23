"""A prompt whose manifest cannot be written (a full disk) leaves none of the arrays it wrote for it,
nor the part of the manifest it wrote aside, and a published prompt keeps what it had."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pytest
import torch

from cache_server.store.blobs import LocalBlobs
from cache_server.store.durable import OsFileOps
from cache_server.store.hidden_store import HiddenStore

H, T = 16, 24


class ManifestFull(OsFileOps):
    """The disk fills up while a prompt's manifest is written (half of it, then ENOSPC), when `full`."""

    full = False

    def write(self, path: Path, data: bytes | memoryview, *, sync: bool) -> None:
        if self.full and path.name.startswith("zarr.json.") and path.parent.parent.name == "prompts":
            super().write(path, bytes(data)[: len(data) // 2], sync=sync)
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write(path, data, sync=sync)


def _layer(seed: int) -> torch.Tensor:
    return torch.randn(T, H, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("existing", [False, True], ids=["new prompt", "layers added"])
def test_a_manifest_that_does_not_fit_leaves_no_array_behind(tmp_path: Path, existing: bool) -> None:
    disk = ManifestFull()
    with HiddenStore(
        LocalBlobs(tmp_path / "store", disk), fingerprint="fp", model_name="t", hidden_size=H, dtype=torch.float32
    ) as store:
        ids = np.arange(T)
        if existing:
            store.write("p", ids, 4, {0: _layer(0)})
        before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "store").rglob("*") if p.is_file())
        disk.full = True
        with pytest.raises(OSError, match="No space left"):
            store.write("p", ids, 4, {1: _layer(1), 2: _layer(2)})
        after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "store").rglob("*") if p.is_file())
        assert after == before
        disk.full = False
        if existing:
            out = np.empty((T, H), np.float32)
            store.read_into("p", [0], out)
            assert np.array_equal(out, _layer(0).numpy())
        assert store.write("p", ids, 4, {1: _layer(1)}).layers == ((0, 1) if existing else (1,))
