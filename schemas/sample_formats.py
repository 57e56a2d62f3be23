"""The layouts a training sample is served in (`HiddenStatesDataset`) and written in (`eval-worker
export`), each the schema of one peer trainer's reader; named here, away from torch, for `--help`."""

from __future__ import annotations

from typing import Literal, get_args

# speculators' offline samples, SpecForge's EAGLE-3 and DFlash offline samples
SampleFormat = Literal["speculators", "specforge-eagle3", "specforge-dflash"]
SAMPLE_FORMATS: tuple[SampleFormat, ...] = get_args(SampleFormat)
# what `eval-worker export` writes: SpecForge's offline files (speculators reads the cache directly)
ExportFormat = Literal["specforge-eagle3", "specforge-dflash"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = get_args(ExportFormat)
