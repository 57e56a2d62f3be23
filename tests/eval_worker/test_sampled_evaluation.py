"""`eval-worker evaluate --draft-sampling probabilistic` against a real server holding greedy and sampled
responses: every number equals the same math run in-process on a direct transformers forward (the
plumbing: the right layers split off, the right setting per prompt, the target's own norm and head),
greedy responses score exactly their chain walk, trees stay on greedy responses, and summaries are per
setting. DFlash (its taps include the target's last layer) and EAGLE-3 (the last layer fetched beside)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from eval_worker.cli import main
from eval_worker.evaluation.walk_types import DraftCost, PromptFeatures, TargetNorm
from eval_worker.exit_codes import ExitCode
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.families.dflash.probabilistic import expected_dflash_prompts
from eval_worker.families.eagle3.drafter import Eagle3Drafter
from eval_worker.families.eagle3.probabilistic import expected_eagle3_prompts
from schemas.prompts import GenerateSpec
from schemas.report import EvalReport, ExpectedRounds
from schemas.sampling import GREEDY
from testing.checkpoints import save_torch_checkpoint
from testing.eagle3 import eagle3_config, random_eagle3, save_eagle3
from testing.live_loop import target_heads
from testing.servers import running_server
from testing.taps import target_forward
from tests.eval_worker.helpers import LAYER_IDS, TRAIN_TEXTS

pytestmark = pytest.mark.slow
SAMPLED = GenerateSpec(max_new_tokens=20, temperature=1.0, top_p=0.95, samples=2, seed=3)
EAGLE_TAPS = [1, 4, 6]  # decoder outputs of an 8-layer target: the last (7) is fetched beside them


def _peaked(directory: Path, layers: int) -> Path:
    """lm_head x 8: a few likely tokens per position, so that T = 1 acceptance is neither none nor all."""
    return build_tiny_model(directory, layers=layers, hidden=64, vocab=512, logit_scale=8.0, seed=0)


def _register(url: str) -> tuple[list[str], list[str]]:
    with CacheClient(url) as client:
        texts = [{"text": t} for t in TRAIN_TEXTS[:3]]
        greedy = [p.prompt_id for p in client.register(texts, max_new_tokens=20)]
        sampled = [p.prompt_id for p in client.register(texts, generate=SAMPLED)]
        client.wait_ready(greedy + sampled)
    return greedy, sampled


def _in_process(model_dir: Path, url: str, ids: list[str], taps: list[int], expected: Any) -> dict[str, ExpectedRounds]:
    """The expected rounds of each prompt from a direct forward of the target over its stored tokens."""
    target = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    last = target.config.num_hidden_layers - 1
    norm = TargetNorm(target.model.norm.weight.detach(), float(target.model.norm.variance_epsilon))
    embed, lm_head = target_heads(target)
    with CacheClient(url) as client:
        states = [client.prompt(pid) for pid in ids]
    prompts, lasts = [], []
    for s in states:
        ids_t = torch.tensor([s.token_ids])
        forward = target_forward(target, ids_t, [*taps, last])
        width = target.config.hidden_size
        prompts.append(PromptFeatures(forward.taps[0, :, : len(taps) * width], list(s.token_ids or []), s.prompt_len))
        lasts.append(forward.taps[0, :, len(taps) * width :])
    sampling = [s.sampling or GREEDY for s in states]
    got = expected(prompts, lasts, sampling, embed, lm_head, norm, DraftCost())
    return dict(zip(ids, got, strict=True))


def _evaluate(url: str, checkpoint: Path, out: Path, *flags: str) -> EvalReport:
    argv = ["evaluate", str(checkpoint), "--server", url, "--all-prompts", "--device", "cpu", *flags]
    assert main([*argv, "--draft-sampling", "probabilistic", "--out", str(out)]) == ExitCode.ok
    return EvalReport.model_validate_json(out.read_text())


def _check(report: EvalReport, truth: dict[str, ExpectedRounds], greedy: list[str], sampled: list[str]) -> None:
    assert report.draft_sampling == ["greedy", "probabilistic"]
    by_id = {p.prompt_id: p for p in report.prompts}
    for pid, want in truth.items():
        got = by_id[pid].probabilistic
        assert got is not None
        assert got.rounds == pytest.approx(want.rounds, rel=1e-9, abs=1e-9)
        assert got.accepted == pytest.approx(want.accepted, rel=1e-9, abs=1e-9)
    for pid in greedy:  # at T = 0 probabilistic drafting is the greedy walk, round for round
        p = by_id[pid]
        assert p.probabilistic == ExpectedRounds(
            rounds=len(p.chain.round_taus),
            accepted=sum(p.chain.round_taus) - len(p.chain.round_taus),
            mean_tau=p.chain.mean,
        )
        assert p.trees or p.eagle_trees
    for pid in sampled:
        p = by_id[pid]
        assert p.sampling is not None and p.sampling.setting == "T=1 top_p=0.95" and p.outside_support == 0
        assert not p.trees and not p.eagle_trees  # trees are walked on greedy responses only
        assert p.probabilistic is not None and 0 < p.probabilistic.accepted < sum(p.chain.round_taus)
    t1 = report.summary.by_sampling["T=1 top_p=0.95"]
    assert set(report.summary.by_sampling) == {"T=0", "T=1 top_p=0.95"}
    assert t1.chain.prompts_evaluated == len(sampled) and t1.chain.stderr is not None
    assert t1.probabilistic is not None and t1.probabilistic.prompts_evaluated == len(sampled)


def test_dflash_expected_rounds_from_the_served_taps(tmp_path: Path, trained_drafter: DFlashDrafter) -> None:
    target = _peaked(tmp_path / "target", 6)  # the shape of the drafter's own target
    checkpoint = save_torch_checkpoint(tmp_path / "dflash.pt", trained_drafter, global_step=1, epoch=0)
    with running_server(target, tmp_path / "store") as url:
        greedy, sampled = _register(url)
        report = _evaluate(url, checkpoint, tmp_path / "report.json", "--tree-budget", "3")
        drafter = trained_drafter

        def expected(*args: Any) -> list[ExpectedRounds]:
            return expected_dflash_prompts(drafter, *args[:6], cost=args[6])

        truth = _in_process(target, url, greedy + sampled, list(LAYER_IDS), expected)
    _check(report, truth, greedy, sampled)
    assert json.loads((tmp_path / "report.json").read_text())["summary"]["probabilistic"]["prompts_evaluated"] == 9


def test_eagle3_expected_rounds_with_the_last_layer_fetched_beside_its_taps(tmp_path: Path) -> None:
    target_dir = _peaked(tmp_path / "target", 8)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    drafter: Eagle3Drafter = random_eagle3(eagle3_config(target.config, draft_vocab_size=160), 3, seed=5)
    checkpoint = save_eagle3(tmp_path / "eagle3", drafter, "specforge", layer_ids=EAGLE_TAPS, steps=3)
    with running_server(target_dir, tmp_path / "store") as url:
        greedy, sampled = _register(url)
        report = _evaluate(url, checkpoint, tmp_path / "report.json", "--eagle-tree", "2,2,4")
        embed = target_heads(target)[0]

        def expected(prompts: Any, lasts: Any, sampling: Any, _: Any, lm_head: Any, norm: Any, cost: Any) -> Any:
            return expected_eagle3_prompts(drafter, prompts, lasts, sampling, embed, lm_head, norm, steps=3, cost=cost)

        truth = _in_process(target_dir, url, greedy + sampled, EAGLE_TAPS, expected)
    assert report.target_layer_ids == EAGLE_TAPS
    _check(report, truth, greedy, sampled)


def test_trees_of_prompts_all_sampled_are_refused_in_one_line_on_the_cli_and_post_jobs(
    tmp_path: Path, trained_drafter: DFlashDrafter, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _peaked(tmp_path / "target", 6)
    checkpoint = save_torch_checkpoint(tmp_path / "dflash.pt", trained_drafter, global_step=1, epoch=0)
    with running_server(target, tmp_path / "store", "--checkpoint-root", str(tmp_path)) as url:
        greedy, sampled = _register(url)
        argv = ["evaluate", str(checkpoint), "--server", url, "--prompts", ",".join(sampled), "--tree-budget", "3"]
        assert main(argv) == ExitCode.usage
        last = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bars
        assert last.startswith("eval-worker: trees at T > 0 are not measured") and "['T=1 top_p=0.95']" in last
        body = {"checkpoint": "dflash.pt", "prompts": sampled, "tree_budgets": [3]}
        refused = httpx.post(f"{url}/jobs", json=body)
        assert (
            refused.status_code == 422
            and refused.json()["error"]["message"].split(":")[0] == "trees at T > 0 are not measured"
        )
        for chosen in (
            {"prompts": sampled},
            {"prompts": greedy + sampled, "tree_budgets": [3]},
        ):  # chain only, or a mix
            assert httpx.post(f"{url}/jobs", json={"checkpoint": "dflash.pt", **chosen}).status_code == 202
