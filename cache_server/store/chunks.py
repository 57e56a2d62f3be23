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
import struct
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from numcodecs import blosc
from zarr.codecs import BloscCodec, BytesCodec
from zarr.core.buffer.cpu import NDBuffer
from zarr.core.chunk_grids import RegularChunkGrid
from zarr.core.chunk_key_encodings import DefaultChunkKeyEncoding
from zarr.core.metadata import ArrayV3Metadata
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


@dataclass(frozen=True)
class BloscChunks:
    """A compressed array exactly as `write_array` writes it, which `ChunkReader` decodes without zarr."""

    array_dir: Path
    chunk_rows: int
    width: int
    dtype: np.dtype[Any]

    @property
    def chunk_nbytes(self) -> int:
        """Compressed size of chunk `c` (its file's size)."""
        return self.chunk_rows * self.width * self.dtype.itemsize  # the last chunk is padded to full size

    def pieces(self, start: int, stop: int) -> list[tuple[int, int, int, int]]:
        """Rows start:stop (stop > start) as (chunk, lo, hi, at): rows lo:hi of `chunk` are rows at:at+hi-lo
        of the range."""
        rows = self.chunk_rows
        found = []
        for c in range(start // rows, (stop - 1) // rows + 1):
            lo, hi = max(start - c * rows, 0), min(stop - c * rows, rows)
            found.append((c, lo, hi, c * rows + lo - start))
        return found


def blosc_chunks(arr: zarr.Array[Any], array_dir: Path) -> BloscChunks | None:
    """`arr`'s layout if its metadata is exactly `write_array(compress=True)`'s pipeline, else None.

    Anything else (token ids, arrays from another writer or an older codec) is read through zarr:
    both paths are exact, this one is only faster.
    """
    md = arr.metadata
    if not isinstance(md, ArrayV3Metadata) or len(md.shape) != 2 or 0 in md.shape:
        return None
    dtype = md.data_type.to_native_dtype()
    grid, keys = md.chunk_grid, md.chunk_key_encoding
    if not (
        isinstance(grid, RegularChunkGrid)
        and grid.chunk_shape[1] == md.shape[1]
        and isinstance(keys, DefaultChunkKeyEncoding)
        and keys.separator == "/"
        and not md.storage_transformers
        and dtype.kind in "uif"
        and dtype.str[0] in "<|"  # little-endian in memory, as the bytes codec writes it to disk
        and md.codecs == (BytesCodec(endian="little"), layer_compressor(dtype.itemsize))
    ):
        return None
    return BloscChunks(array_dir, grid.chunk_shape[0], md.shape[1], dtype)


# Blosc 1 header: version, versionlz, flags, typesize (1 byte each), then uint32 LE nbytes, blocksize, cbytes.
# Unless the chunk is stored uncompressed (MEMCPYED), an int32 offset per block follows, then the blocks,
# each compressed on its own: a row range needs only the blocks that hold it.
_BLOSC_HEADER = struct.Struct("<BBBBIII")
_MEMCPYED = 0x02


def _blocks_holding(src: memoryview, lo: int, hi: int, into: np.ndarray) -> tuple[memoryview, int]:
    """A Blosc 1 chunk written into `into` holding only the blocks of `src` that cover its decoded bytes
    [lo, hi), and the offset of byte `lo` in what it decodes to. ValueError on a damaged block table."""
    version, versionlz, flags, typesize, nbytes, blocksize, cbytes = _BLOSC_HEADER.unpack_from(src)
    nblocks = -(-nbytes // blocksize)
    starts = struct.unpack_from(f"<{nblocks}i", src, _BLOSC_HEADER.size)
    ends = (*starts[1:], cbytes)
    first, last = lo // blocksize, (hi - 1) // blocksize
    table = _BLOSC_HEADER.size + 4 * nblocks
    if any(not table <= a <= b <= cbytes for a, b in zip(starts, ends, strict=True)):
        raise ValueError("the chunk's block table is damaged")
    count = last - first + 1
    offset = _BLOSC_HEADER.size + 4 * count
    out = memoryview(into.data)
    new_starts = []
    for k in range(first, last + 1):
        size = ends[k] - starts[k]
        out[offset : offset + size] = src[starts[k] : ends[k]]
        new_starts.append(offset)
        offset += size
    sub_nbytes = min(nbytes, (last + 1) * blocksize) - first * blocksize
    _BLOSC_HEADER.pack_into(out, 0, version, versionlz, flags, typesize, sub_nbytes, blocksize, offset)
    struct.pack_into(f"<{count}i", out, _BLOSC_HEADER.size, *new_starts)
    return out[:offset], lo - first * blocksize


class ChunkReader:
    """Decodes `BloscChunks` chunk files in the calling thread, reusing that thread's buffers.

    Each chunk is one `readinto` into a reused file buffer and one Blosc decode (which releases the
    GIL, so the store's threads decode chunks in parallel) into a reused scratch, copied once into
    its strided slice of `out`, or decoded straight into `out` when that slice is contiguous. Each
    thread keeps up to one compressed and one decoded chunk (~7 + 10 MB at H=5120 bf16).

    Measured on a shared 2-core VM, 5 layers [2048, 5120] bf16 (105 MB), 4 read threads: the
    bench/serve_hidden.py "store read" row (`hidden_body`, fresh 105 MB body + token ids) went from
    95 / 114 ms through zarr to 54 / 64 / 63 ms (plain `.bin` readinto: 13-23 ms). In one process,
    interleaved: `read_into` a reused buffer 38 ms vs zarr 51 ms; one layer 8.4 vs 13.3 ms. Per 1024-row
    chunk on one core: readinto 0.25 ms, decode 4.6 ms, column copy 0.5 ms - the decode is the floor.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def read(self, chunks: BloscChunks, chunk: int, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows lo:hi of chunk `chunk` into `out` ([hi - lo, width]; a strided view is fine).

        Raises FileNotFoundError for an absent chunk file and ValueError for one whose size or
        header is wrong, which zarr would read as zeros or fail on less clearly.
        """
        nbytes = chunks.chunk_nbytes
        src = self._read_file(chunk_file(chunks.array_dir, chunk), chunk)
        if len(src) < _BLOSC_HEADER.size:
            raise ValueError(f"chunk {chunk} is truncated to {len(src)} bytes")
        _, _, flags, _, decoded, blocksize, cbytes = _BLOSC_HEADER.unpack_from(src)
        # Blosc trusts the header's cbytes: a truncated file must be caught before it decodes.
        if cbytes != len(src) or decoded != nbytes:
            raise ValueError(
                f"chunk {chunk} is damaged: {len(src)} bytes on disk, its header says {cbytes} "
                f"decoding to {decoded}, the array needs {nbytes}"
            )
        # zarr sets numcodecs.blosc.use_threads = False on import, so each call decodes with its own
        # context and no global lock: the store's threads decode chunks in parallel.
        row_bytes = chunks.width * chunks.dtype.itemsize
        part = (lo * row_bytes) // blocksize > 0 or -(-hi * row_bytes // blocksize) < -(-nbytes // blocksize)
        if flags & _MEMCPYED:  # stored as is: no decoding at all
            raw = np.frombuffer(src, np.uint8, hi * row_bytes - lo * row_bytes, _BLOSC_HEADER.size + lo * row_bytes)
            out[...] = raw.view(chunks.dtype).reshape(hi - lo, chunks.width)
            return
        if part:  # only the blocks holding rows lo:hi, not the whole chunk
            src, skip = _blocks_holding(src, lo * row_bytes, hi * row_bytes, self._buffer("blocks", len(src)))
            decoded_rows = self._buffer("scratch", _BLOSC_HEADER.unpack_from(src)[4])
            self._decode(src, decoded_rows, chunk)
            out[...] = decoded_rows[skip : skip + (hi - lo) * row_bytes].view(chunks.dtype).reshape(hi - lo, -1)
            return
        whole = lo == 0 and hi == chunks.chunk_rows and out.dtype == chunks.dtype and out.flags.c_contiguous
        dest = out if whole else self._buffer("scratch", nbytes).view(chunks.dtype)
        self._decode(src, dest, chunk)
        if not whole:
            out[...] = dest.reshape(chunks.chunk_rows, chunks.width)[lo:hi]

    @staticmethod
    def _decode(src: memoryview, dest: np.ndarray, chunk: int) -> None:
        try:
            blosc.decompress(src, dest)
        except RuntimeError as e:
            raise ValueError(f"chunk {chunk} does not decode: {e}") from e

    def _read_file(self, path: Path, chunk: int) -> memoryview:
        try:
            f = open(path, "rb", buffering=0)  # noqa: SIM115  # closed by the `with` below
        except FileNotFoundError as e:
            raise FileNotFoundError(f"chunk {chunk} is missing") from e
        with f:
            size = os.fstat(f.fileno()).st_size
            buf = self._buffer("file", size).data
            got = 0
            while got < size:
                n = f.readinto(buf[got:])
                if not n:
                    break
                got += n
        return buf[:got]

    def _buffer(self, name: str, nbytes: int) -> np.ndarray:
        """This thread's buffer `name`, grown to at least `nbytes`; its first `nbytes` bytes."""
        buf: np.ndarray | None = getattr(self._local, name, None)
        if buf is None or buf.nbytes < nbytes:
            buf = np.empty(nbytes, dtype=np.uint8)
            setattr(self._local, name, buf)
        return buf[:nbytes]


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
