"""One stored array: the lossless codec, the chunking, its objects as written, reads through zarr.

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

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import zarr
from numcodecs import Blosc
from zarr.codecs import BloscCodec
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import NDBuffer
from zarr.storage import MemoryStore

from schemas.block_digests import chunk_digests

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
ZARR_JSON = "zarr.json"
CRC_ATTRIBUTE = "chunk_crc32"  # an array attribute: zlib.crc32 of each stored chunk, in order
# An attribute of compressed arrays: per chunk, `schemas.block_digests.chunk_digests` (its head's digest,
# then each Blosc block's), which every read checks. Arrays written before it have only the crc32s.
DIGESTS_ATTRIBUTE = "block_xxh3_64"


def layer_compressor(itemsize: int) -> BloscCodec:
    """Blosc zstd level 1 with byte shuffle over 1 MiB blocks; lossless for any dtype."""
    return BloscCodec(cname="zstd", clevel=1, shuffle="shuffle", typesize=itemsize, blocksize=BLOSC_BLOCKSIZE)


def describe(itemsize: int) -> str:
    """Human-readable codec line for the manifest."""
    return f"blosc(cname=zstd, clevel=1, shuffle=byte, typesize={itemsize}, blocksize={BLOSC_BLOCKSIZE})"


def chunk_key(array: str, row_chunk: int, ndim: int) -> str:
    """The key of chunk `row_chunk` of an array written by `array_objects` (chunked over rows only)."""
    return "/".join([array, "c", str(row_chunk), *["0"] * (ndim - 1)])


def array_objects(data: np.ndarray, *, compress: bool, block_digests: bool = True) -> tuple[bytes, list[bytes]]:
    """`data` as a Zarr v3 array chunked over rows: its `zarr.json` and its encoded chunks in order.

    Encoded here rather than by zarr so that each chunk's checksums ride in the array's attributes:
    its crc32 (`chunk_crc32`) and, compressed, its blocks' digests (`block_xxh3_64`; without
    `block_digests`, an array as written before them), which readers check; the bytes are exactly
    what zarr writes and reads back.
    Every chunk is written, the last one padded with the fill value as zarr does, so a missing
    chunk always means damage (zarr would read it as zeros).
    """
    rows = max(1, min(CHUNK_TOKENS, data.shape[0]))
    little = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))
    codec = Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=BLOSC_BLOCKSIZE, typesize=little.itemsize)
    encoded: list[bytes] = []
    for c in range(-(-data.shape[0] // rows)):
        block = little[c * rows : (c + 1) * rows]
        if len(block) < rows:
            block = np.concatenate([block, np.zeros((rows - len(block), *data.shape[1:]), little.dtype)])
        encoded.append(codec.encode(block) if compress else block.tobytes())
    attributes: dict[str, Any] = {CRC_ATTRIBUTE: [zlib.crc32(b) for b in encoded]}
    if compress and block_digests:
        attributes[DIGESTS_ATTRIBUTE] = [chunk_digests(b) for b in encoded]
    arr = zarr.create_array(
        store=MemoryStore(),
        shape=data.shape,
        dtype=data.dtype,
        chunks=(rows, *data.shape[1:]),
        compressors=layer_compressor(little.itemsize) if compress else None,
        fill_value=0,
        attributes=attributes,
        chunk_key_encoding={"name": "default", "separator": "/"},
        zarr_format=3,
    )
    return arr.metadata.to_buffer_dict(default_buffer_prototype())[ZARR_JSON].to_bytes(), encoded


def read_rows(arr: zarr.Array[Any], exists: Callable[[str], bool], start: int, stop: int, out: np.ndarray) -> None:
    """Decode rows start:stop of a 2-D array into `out` (a strided view is fine) through zarr: any
    array, but slower than `ChunkReader` on the ones `blosc_chunks` accepts. `exists(key)` says whether
    a chunk key (relative to the array) is stored.

    Raises FileNotFoundError for an absent chunk, which zarr would silently read as zeros: before the
    read, and after it for one deleted (pruned) while zarr read it.
    """
    _check_chunks(arr, exists, start, stop)
    # zarr decodes each chunk into its own buffer and copies it once into `out`.
    arr.get_basic_selection((slice(start, stop), slice(None)), out=NDBuffer(out))  # type: ignore[arg-type]
    _check_chunks(arr, exists, start, stop)


def _check_chunks(arr: zarr.Array[Any], exists: Callable[[str], bool], start: int, stop: int) -> None:
    rows, cols = arr.shards or arr.chunks  # the shape of one stored object
    for c in range(start // rows, (stop - 1) // rows + 1):
        for j in range(-(-arr.shape[1] // cols)):
            if not exists(arr.metadata.encode_chunk_key((c, j))):
                raise FileNotFoundError(f"chunk {c} is missing")
