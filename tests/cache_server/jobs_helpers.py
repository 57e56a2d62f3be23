"""Small helpers for the job tests: a valid report body and a checkpoint root with traps in it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from schemas.jobs import JobSubmit


def report_body(worker: str = "w", checkpoint: str = "ckpt") -> dict[str, Any]:
    """The smallest valid `EvalReport` (no prompts); `target_name` carries who wrote it."""
    empty = {
        "mean_tau": None,
        "tokens_per_round": None,
        "total_tokens": 0,
        "total_rounds": 0,
        "histogram": {},
        "prompts_evaluated": 0,
        "prompts_without_rounds": 0,
    }
    return {
        "checkpoint_path": checkpoint,
        "format": "hf_dir",
        "step": None,
        "epoch": None,
        "target_name": worker,
        "target_fingerprint": "f" * 16,
        "target_layer_ids": [1, 3],
        "layer_ids_source": "checkpoint",
        "drafter_family": "dflash",
        "drafting": {"family": "dflash", "block_size": 4, "mask_token_id": 0, "tree_budgets": []},
        "device": "cpu",
        "dtype": "float32",
        "prompts": [],
        "summary": {
            "chain": empty,
            "trees": {},
            "prompts_evaluated": 0,
            "prompts_not_target_greedy": 0,
            "wall_time_s": 0.0,
        },
    }


def spec(checkpoint: str = "/ckpt/a", **kw: Any) -> JobSubmit:
    return JobSubmit(checkpoint=checkpoint, **kw)


def write_hf_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 8)
    return path


def checkpoint_tree(tmp: Path) -> tuple[Path, Path]:
    """`root/` with good checkpoints and traps, and `outside/` beside it holding real checkpoints.

    root/hf/                 config.json + model.safetensors
    root/runs/step100.pt     torch.save archive
    root/notes.txt           text, not a checkpoint
    root/half/               config.json only
    root/escape.pt ->        outside/stolen.pt
    root/linked/             config.json + model.safetensors -> outside/hf/model.safetensors
    root/inner.pt ->         runs/step100.pt (a symlink that stays inside: fine)
    """
    root, outside = tmp / "root", tmp / "outside"
    write_hf_dir(root / "hf")
    (root / "runs").mkdir()
    torch.save({"model_state_dict": {"w": torch.zeros(2)}}, root / "runs" / "step100.pt")
    (root / "notes.txt").write_text("not a checkpoint\n")
    (root / "half").mkdir()
    (root / "half" / "config.json").write_text("{}")
    write_hf_dir(outside / "hf")
    torch.save({"model_state_dict": {}}, outside / "stolen.pt")
    os.symlink(outside / "stolen.pt", root / "escape.pt")
    (root / "linked").mkdir()
    (root / "linked" / "config.json").write_text("{}")
    os.symlink(outside / "hf" / "model.safetensors", root / "linked" / "model.safetensors")
    os.symlink(root / "runs" / "step100.pt", root / "inner.pt")
    return root, outside


def flat_report_body(family: str = "dflash", worker: str = "w") -> dict[str, Any]:
    """`report_body` as reports were written before the family blocks: the family's fields flat."""
    body = {k: v for k, v in report_body(worker).items() if k not in ("drafting", "drafter_family")}
    if family == "dflash":
        return body | {"block_size": 4, "mask_token_id": 0, "tree_budgets": [8]}
    return body | {
        "drafter_family": family,
        "layout": "eagle",
        "block_size": None,
        "mask_token_id": None,
        "steps": 3,
        "draft_vocab_size": 64,
        "tree_budgets": [],
        "eagle_trees": ["4,3,16"],
    }


# The coordination schema at version 6: the jobs table with one column per option.
V6_DDL = (
    "CREATE TABLE schema_version (version INTEGER NOT NULL)",
    "INSERT INTO schema_version (version) VALUES (6)",
    """CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY, seq INTEGER,
        status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')),
        checkpoint TEXT NOT NULL, checkpoint_relative TEXT NOT NULL, prompts TEXT NOT NULL,
        tree_budgets TEXT NOT NULL, target_layer_ids TEXT, block_size INTEGER, steps INTEGER,
        eagle_trees TEXT NOT NULL DEFAULT '[]', layer_convention TEXT, sets TEXT NOT NULL DEFAULT '[]',
        draft_sampling TEXT NOT NULL DEFAULT 'greedy', target_fingerprint TEXT,
        attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL, worker TEXT, lease TEXT,
        lease_s DOUBLE PRECISION, created_at DOUBLE PRECISION NOT NULL, started_at DOUBLE PRECISION,
        finished_at DOUBLE PRECISION, lease_expires_at DOUBLE PRECISION, error TEXT, report TEXT
    )""",
    "CREATE INDEX jobs_by_status ON jobs (status)",
    "CREATE INDEX jobs_claim_order ON jobs (status, seq)",
)


def write_v6_database(location: str, jobs: list[dict[str, Any]]) -> None:
    """A coordination database as a version 6 server left it, holding `jobs` (column -> value; the
    columns every job needs default to a queued job of all prompts)."""
    from sqlalchemy import create_engine, text

    from cache_server.coordination.database import database_url

    engine = create_engine(database_url(location))
    with engine.begin() as c:
        for statement in V6_DDL:
            c.exec_driver_sql(statement)
        for seq, job in enumerate(jobs, 1):
            row = {
                "seq": seq,
                "status": "queued",
                "checkpoint": "/r/a.pt",
                "checkpoint_relative": "a.pt",
                "prompts": '"all"',
                "tree_budgets": "[]",
                "max_attempts": 3,
                "created_at": 1.0,
            } | job
            columns = ", ".join(row)
            c.execute(text(f"INSERT INTO jobs ({columns}) VALUES ({', '.join(':' + k for k in row)})"), row)
    engine.dispose()
