"""What a drafter checkpoint looks like on disk, for the server's job intake, `watch` and the loader.

Two layouts: a Hugging Face directory holding `config.json` + `model.safetensors` (shards named by
`model.safetensors.index.json`, as a target with its MTP heads is published; or, as older EAGLE
checkpoints ship, `pytorch_model.bin`), or a file that `torch.save` wrote, which is a zip archive
whatever its extension (legacy pickles are refused).
"""

from __future__ import annotations

import zipfile
from pathlib import Path

HF_CONFIG = "config.json"
HF_WEIGHTS = "model.safetensors"
HF_WEIGHTS_INDEX = "model.safetensors.index.json"  # sharded weights: tensor name -> shard file
HF_BIN_WEIGHTS = "pytorch_model.bin"
HF_DIR_HOLDS = f"{HF_CONFIG} + {HF_WEIGHTS} (or {HF_WEIGHTS_INDEX} and its shards, or {HF_BIN_WEIGHTS})"
TRAINER_STATE = "trainer_state.json"  # beside them, where a trainer says the step (`global_step`)
# Names `watch` looks at for torch files; a submitted file of any name is accepted if it is a zip.
TORCH_SUFFIXES = (".pt", ".pth")


def hf_files(path: Path) -> tuple[str, ...]:
    """The config and weights file names of a HF checkpoint directory (safetensors first, as the loader
    reads them), or () unless both are regular files."""
    if not path.is_dir() or not (path / HF_CONFIG).is_file():
        return ()
    weights = next((name for name in (HF_WEIGHTS, HF_WEIGHTS_INDEX, HF_BIN_WEIGHTS) if (path / name).is_file()), None)
    return (HF_CONFIG, weights) if weights else ()


def is_torch_archive(path: Path) -> bool:
    """A complete `torch.save` zip archive (its central directory, written last, is there)."""
    with path.open("rb") as f:
        return zipfile.is_zipfile(f)
