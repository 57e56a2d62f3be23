"""Find finished checkpoints under a directory: a torch.save file or a HF checkpoint directory whose
files have stopped changing between two looks (a file still being written is never submitted)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from schemas.checkpoint_layout import TORCH_SUFFIXES, hf_files, is_torch_archive


def _candidates(root: Path) -> Iterator[tuple[Path, tuple[Path, ...]]]:
    """(checkpoint, the files whose stability says it is finished)."""
    for path in sorted(root.rglob("*")):
        if path.name.startswith("."):
            continue
        if path.is_file() and path.suffix in TORCH_SUFFIXES:
            yield path, (path,)
        elif files := hf_files(path):
            yield path, tuple(path / f for f in files)


def _signature(files: tuple[Path, ...]) -> tuple[tuple[int, int], ...] | None:
    try:
        return tuple((s.st_size, s.st_mtime_ns) for s in (f.stat() for f in files))
    except FileNotFoundError:
        return None


@dataclass
class CheckpointWatcher:
    """`poll()` returns checkpoints that became complete since the last poll, each once."""

    root: Path
    seen: set[Path] = field(default_factory=set)
    _last: dict[Path, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    def poll(self) -> list[Path]:
        """Checkpoints whose files did not change since the last look (and are complete)."""
        ready = []
        for ckpt, files in _candidates(self.root):
            if ckpt in self.seen:
                continue
            sig = _signature(files)
            if sig is None:
                continue
            if self._last.get(ckpt) == sig and _complete(ckpt):
                ready.append(ckpt)
                self.seen.add(ckpt)
                del self._last[ckpt]
            else:
                self._last[ckpt] = sig  # new or still changing: look again next time
        return ready


def _complete(ckpt: Path) -> bool:
    """A torch.save zip is readable only once its central directory, written last, is there."""
    return ckpt.is_dir() or is_torch_archive(ckpt)
