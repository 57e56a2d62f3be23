"""One stored array on disk: the lossless codec, the chunking, durable writes, reads into a buffer.

Measured by bench/codec_choice.py on a 2-core machine, one LLM-like bf16 layer [2048, 2048]
(normal activations, per-channel scales, 8 outlier channels), single-threaded as zarr runs it:

    codec                                     ratio  enc GB/s  dec GB/s
    blosc zstd clevel1 shuffle bs=1MiB        1.446      0.59      2.25   <- chosen
    blosc zstd clevel1 shuffle bs=auto        1.263      0.54      0.71
    blosc defaults (lz4 clevel5 shuffle)      1.083      1.01      3.84
    zarr BloscCodec defaults (zstd 5 shuf)    1.396      0.05      1.38
    blosc lz4 clevel5 shuffle bs=1MiB         1.088      1.00      3.91
    zstd level1 (no shuffle)                  1.265      1.01      1.39
    none                                      1.000     26.40     11.18

([2048, 5120] gives the same picture: 1.448 / 0.50 / 2.19 for the chosen codec.)
Byte shuffle puts the bf16 sign+exponent bytes together, which is where the redundancy is; the
1 MiB block is what lets zstd see it (auto blocks are too small). LZ4 is faster but saves ~8%
against ~31%: on a cache sized in terabytes the disk, not the 2.2 GB/s decode, is the limit.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec
from zarr.core.buffer.cpu import NDBuffer
from zarr.storage import LocalStore

# What zarr stores for each dtype name: the same width, a dtype zarr 3.1 knows (it has no bfloat16,
# so bf16 is stored as its uint16 bit pattern and the real dtype lives in the manifest).
_STORAGE_DTYPES: dict[str, np.dtype[Any]] = {
    "bfloat16": np.dtype(np.uint16),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
}


def storage_dtype(name: str) -> np.dtype[Any]:
    """The element type of the zarr arrays for a dtype name (uint16 for bf16)."""
    return _STORAGE_DTYPES[name]


# Rows (tokens) per chunk: a [start, stop) read touches at most ceil(len / 1024) + 1 chunks per layer.
CHUNK_TOKENS = 1024
BLOSC_BLOCKSIZE = 1 << 20


def layer_compressor(itemsize: int) -> BloscCodec:
    """Blosc zstd level 1 with byte shuffle over 1 MiB blocks; lossless for any dtype."""
    return BloscCodec(cname="zstd", clevel=1, shuffle="shuffle", typesize=itemsize, blocksize=BLOSC_BLOCKSIZE)


def describe(itemsize: int) -> str:
    """Human-readable codec line for the manifest."""
    return f"blosc(cname=zstd, clevel=1, shuffle=byte, typesize={itemsize}, blocksize={BLOSC_BLOCKSIZE})"


def chunk_file(array_dir: Path, row_chunk: int) -> Path:
    """The file holding chunk `row_chunk` of a 2-D array written by `write_array`."""
    return array_dir / "c" / str(row_chunk) / "0"


def write_array(path: Path, data: np.ndarray, *, compress: bool) -> None:
    """Write `data` (chunked over rows) as a new zarr v3 array at `path`; not yet fsynced."""
    zarr.create_array(
        store=LocalStore(path),
        data=data,
        chunks=(max(1, min(CHUNK_TOKENS, data.shape[0])), *data.shape[1:]),
        compressors=layer_compressor(data.dtype.itemsize) if compress else None,
        fill_value=0,
        # Write every chunk, even all-zero ones (zarr skips them by default and reads zeros back),
        # so a missing chunk file always means damage.
        config={"write_empty_chunks": True},
        chunk_key_encoding={"name": "default", "separator": "/"},
        zarr_format=3,
    )


def open_array(path: Path) -> zarr.Array[Any]:
    """Open a stored array read-only."""
    return zarr.open_array(store=LocalStore(path, read_only=True), mode="r", zarr_format=3)


def read_rows(arr: zarr.Array[Any], array_dir: Path, start: int, stop: int, out: np.ndarray) -> None:
    """Decode rows start:stop of a 2-D array from `write_array` into `out` (a strided view is fine)
    through zarr: any array, but slower than `ChunkReader` on the ones `blosc_chunks` accepts.

    Raises FileNotFoundError for an absent chunk, which zarr would silently read as zeros.
    """
    rows, cols = arr.shards or arr.chunks  # the shape of one stored file
    for c in range(start // rows, (stop - 1) // rows + 1):
        for j in range(-(-arr.shape[1] // cols)):
            if not (array_dir / arr.metadata.encode_chunk_key((c, j))).is_file():
                raise FileNotFoundError(f"chunk {c} is missing")
    # zarr decodes each chunk into its own buffer and copies it once into `out`.
    arr.get_basic_selection((slice(start, stop), slice(None)), out=NDBuffer(out))  # type: ignore[arg-type]


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under `root`, children first."""
    # zarr's LocalStore renames each chunk into place but never fsyncs.
    for dirpath, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def replace_file(path: Path, payload: bytes) -> None:
    """Atomically replace `path`: write aside as `<name>.<uuid>.tmp`, fsync, rename, fsync the dir."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
