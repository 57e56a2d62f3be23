"""An MTP head fine-tuned a little on cached states (a real cache server on its target) is accepted more
often on held-out prompts, and the MTP-only checkpoint it is saved as loads back to the same head."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cache_server.client import CacheClient
from eval_worker.checkpoints.loaded_checkpoint import LoadRequest
from eval_worker.checkpoints.raw import read_raw
from eval_worker.cli import main
from eval_worker.evaluation.walk_types import TargetNorm
from eval_worker.families import family_of
from eval_worker.families.mtp.drafter import MtpDrafter
from schemas.report import EvalReport
from testing.mtp_targets import Tuning, save_qwen3_next_mtp
from testing.mtp_trainer import save_mtp_only, train_mtp_head
from testing.servers import running_server

pytestmark = pytest.mark.slow
TRAIN = [[i, i + 1, i + 2, 7] for i in range(10, 200, 12)]
HELD_OUT = [[5, 17, 3, 99, 250], [400, 7, 7, 31], [60, 61, 62]]


def _tau(url: str, checkpoint: Path, out: Path) -> float:
    argv = ["evaluate", str(checkpoint), "--server", url, "--set", "held-out", "--steps", "2", "--device", "cpu"]
    assert main([*argv, "--out", str(out)]) == 0
    tau = EvalReport.model_validate_json(out.read_text()).summary.chain.mean_tau
    assert tau is not None
    return tau


def test_a_head_trained_on_cached_states_drafts_better(tmp_path: Path) -> None:
    target = save_qwen3_next_mtp(tmp_path / "target", linear_attention=False, tuning=Tuning(0.1, 0.0, 0.0))
    with running_server(target, tmp_path / "store") as url, CacheClient(url) as client:
        specs = [{"token_ids": p, "sets": ["train"]} for p in TRAIN]
        specs += [{"token_ids": p, "sets": ["held-out"]} for p in HELD_OUT]
        client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=24)])
        info = client.model()
        heads = client.heads()
        embed, lm_head = (t.float() for t in heads.to_torch())
        norm = TargetNorm.served(heads)
        assert norm is not None
        raw = read_raw(target)
        loaded = family_of(raw.config).load(target, raw, info, LoadRequest())
        head = loaded.drafter
        assert isinstance(head, MtpDrafter)
        last = info.num_layers - 1
        cached = [client.hidden(s.prompt_id, [last]) for s in client.prompts(set_name="train")]
        normed = [norm(torch.from_numpy(c.hidden.copy())).detach() for c in cached]
        tokens = [torch.from_numpy(c.token_ids.copy()) for c in cached]
        loss = train_mtp_head(head, normed, tokens, embed, lm_head, steps=150, lr=3e-3)
        config = json.loads((target / "config.json").read_text())
        trained = save_mtp_only(tmp_path / "runs" / "mtp-step-150", config, head, step=150)
        before, after = _tau(url, target, tmp_path / "before.json"), _tau(url, trained, tmp_path / "after.json")
    assert after > before + 0.2, (before, after, loss)
    reloaded = family_of(read_raw(trained).config).load(trained, read_raw(trained), info, LoadRequest())
    assert reloaded.step == 150
    ours, theirs = head.state_dict(), reloaded.drafter.state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[k], theirs[k]) for k in ours)
