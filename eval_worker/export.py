"""`eval-worker export`: a prompt set's cached hidden states written as SpecForge 0.2's offline training
files, one `torch.save` dict (`.ckpt`) per prompt, named so that sorting them gives the set's order.
The samples are `HiddenStatesDataset`'s; this module owns the files: names, manifest, atomic writes."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from cache_server.client.torch_dataset import HiddenStatesDataset, Sample
from eval_worker.commands import connect
from schemas.choices import one_of
from schemas.layers import RequestLayerConvention
from schemas.sample_formats import EXPORT_FORMATS, ExportFormat

if TYPE_CHECKING:
    from cache_server.client import CacheClient
    from eval_worker.settings import ConnectionSettings

log = logging.getLogger(__name__)

MANIFEST = "export.json"  # SpecForge's reader lists only *.ckpt and *.ckpt.gz: this never reaches training
PARTIAL = ".partial"  # a file being written: a hidden name that SpecForge's reader does not list
EAGLE3_LAYERS = 3  # SpecForge resolves exactly three EAGLE-3 capture layers (resolve_eagle_capture_layers)
INDEX_DIGITS = 8
PROGRESS_EVERY = 100


@dataclass(frozen=True)
class ExportRequest:
    """What to export: a set's prompts in `format`, aux `layers` in `layer_convention`, into `out`."""

    out: Path
    format: ExportFormat
    set_name: str
    layers: list[int]
    layer_convention: RequestLayerConvention = "decoder_output_0based"
    prefetch: int = 4


@dataclass(frozen=True)
class Manifest:
    """What an export directory holds (`export.json`): a rerun resumes only the same export."""

    format: str
    set_name: str
    layers: list[int]  # 0-based decoder outputs, as served
    model_fingerprint: str
    prompt_ids: list[str]

    def file_names(self) -> list[str]:
        """Each prompt's file, in the set's order: `data_<index>_<prompt id>.ckpt`, the index zero-padded."""
        digits = max(INDEX_DIGITS, len(str(len(self.prompt_ids) - 1)))
        return [f"data_{i:0{digits}d}_{re.sub(r'[^0-9A-Za-z_-]', '_', p)}.ckpt" for i, p in enumerate(self.prompt_ids)]


@dataclass(frozen=True)
class ExportSummary:
    """What one run did: files written (and their bytes), files already complete, prompts left out."""

    out: Path
    written: int
    skipped: int
    bytes_written: int
    left_out: list[str] = field(default_factory=list)

    def line(self) -> str:
        """The run as one line."""
        text = (
            f"{self.written} files written ({self.bytes_written} bytes), {self.skipped} already complete, in {self.out}"
        )
        if self.left_out:
            text += (
                f"; {len(self.left_out)} prompts left out (SpecForge's DFlash reader needs two adjacent "
                f"response tokens): {', '.join(self.left_out)}"
            )
        return text


def export(request: ExportRequest, settings: ConnectionSettings) -> ExportSummary:
    """Write every prompt of the set not yet in `request.out`, fetched a few ahead (ValueError for a bad
    request, or an `out` that holds another export)."""
    out = _out_dir(request.out)
    one_of(request.format, EXPORT_FORMATS, "format")  # a speculators sample is no SpecForge file
    if request.format == "specforge-eagle3" and len(request.layers) != EAGLE3_LAYERS:
        raise ValueError(f"specforge-eagle3 takes exactly {EAGLE3_LAYERS} layers (as SpecForge), got {request.layers}")
    with connect(settings) as client:
        _check_set(client, request.set_name)
        dataset = HiddenStatesDataset(
            settings.server_urls()[0],
            layers=request.layers,
            format=request.format,
            set_name=request.set_name,
            layer_convention=request.layer_convention,
            token=settings.token,
            wait_s=settings.timeout_s,
            prefetch=request.prefetch,
        )
        fingerprint = client.model().fingerprint
        manifest = Manifest(request.format, request.set_name, dataset.aux, fingerprint, dataset.prompt_ids)
        names = _claim(out, manifest)
        todo = [(out / n, p) for n, p in zip(names, manifest.prompt_ids, strict=True) if not (out / n).exists()]
        written, size, left_out = 0, 0, []
        samples = dataset.samples_of(client, [p for _, p in todo])
        for (path, prompt_id), sample in zip(todo, samples, strict=True):
            if request.format == "specforge-dflash" and not adjacent_supervised(sample["loss_mask"]):
                left_out.append(prompt_id)
                continue
            size += write_atomically(path, sample)
            written += 1
            if written % PROGRESS_EVERY == 0:
                log.info("export: %d of %d files written", written, len(todo))
    return ExportSummary(out, written, len(names) - len(todo), size, left_out)


def _out_dir(out: Path) -> Path:
    """`out` (ValueError when it is a file); created once the request has been checked (`_claim`)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file: export writes a directory of .ckpt files")
    return out


def _check_set(client: CacheClient, set_name: str) -> None:
    """ValueError naming the server's sets when it has none called `set_name`."""
    names = [s.name for s in client.sets().sets]
    if set_name not in names:
        raise ValueError(f"no prompt set {set_name!r} on the server; its sets: {', '.join(names) or 'none'}")


def _claim(out: Path, manifest: Manifest) -> list[str]:
    """The file names of `manifest`'s export, after checking that `out` holds this export or nothing
    SpecForge would read (ValueError otherwise); writes the manifest the first time."""
    names = manifest.file_names()
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST
    if path.exists():
        _same_export(_read_manifest(path), manifest, out)
    foreign = sorted(str(p.relative_to(out)) for p in out.rglob("*.ckpt*") if _read_by_specforge(p, out, names))
    if foreign:
        raise ValueError(
            f"{out} holds .ckpt files this export does not write ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}), which SpecForge would read too: export into an empty directory"
        )
    if not path.exists():
        text = json.dumps(asdict(manifest), indent=1)
        tmp = path.with_name(f".{path.name}{PARTIAL}")
        tmp.write_text(text)
        os.replace(tmp, path)
    return names


def _read_manifest(path: Path) -> Manifest:
    """The manifest at `path` (ValueError when it is not one)."""
    try:
        return Manifest(**json.loads(path.read_text()))
    except (ValueError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path} is not an export manifest ({e}): export into another directory") from None


def _read_by_specforge(path: Path, out: Path, names: Sequence[str]) -> bool:
    """Whether SpecForge's reader would list `path` while it is none of this export's files."""
    listed = path.name.endswith((".ckpt", ".ckpt.gz"))
    return listed and not (path.parent == out and path.name in names)


def _same_export(old: Manifest, new: Manifest, out: Path) -> None:
    """ValueError naming what differs when `out` holds another export than this run's."""
    for what in ("format", "set_name", "layers", "model_fingerprint"):
        before, now = getattr(old, what), getattr(new, what)
        if before != now:
            raise ValueError(
                f"{out} holds an export with {what} {before!r}, this run asks for {now!r}: "
                "export into another directory"
            )
    if old.prompt_ids != new.prompt_ids:
        at = next((i for i, (a, b) in enumerate(zip(old.prompt_ids, new.prompt_ids, strict=False)) if a != b), None)
        where = f"prompt {at} differs" if at is not None else "prompts were added or removed"
        raise ValueError(
            f"set {new.set_name!r} changed since {out} was written ({len(old.prompt_ids)} prompts then, "
            f"{len(new.prompt_ids)} now; {where}): export into another directory"
        )


def adjacent_supervised(loss_mask: torch.Tensor) -> bool:
    """Whether the mask [T] has two adjacent 1s, without which SpecForge's DFlash reader refuses a sample."""
    return bool((loss_mask[:-1].bool() & loss_mask[1:].bool()).any())


def write_atomically(path: Path, sample: Sample) -> int:
    """`sample` as one `torch.save` file at `path`, written under a temporary name and then renamed (a
    killed run leaves no half file under the final name); returns its bytes."""
    # each tensor in storage of its own: torch.save writes a view's whole storage (all fetched layers)
    record = {k: v.clone(memory_format=torch.contiguous_format) for k, v in sample.items()}
    tmp = path.with_name(f".{path.name}{PARTIAL}")
    with tmp.open("wb") as f:
        torch.save(record, f)
        f.flush()
        os.fsync(f.fileno())  # the bytes are on disk before the name says the file is complete
    os.replace(tmp, path)
    return path.stat().st_size
