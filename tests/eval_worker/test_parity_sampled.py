"""`eval-worker parity` at T > 0 against the in-process test engine (`testing/spec_engine.py`, vLLM's
rejection sampler) and a real cache server, on a tiny target whose lm_head is scaled by 8 (peaked, as a
trained LM's next-token distribution is): the probe finds the engine lossless, the offline chain walk over
the engine's own sampled paths counts its rounds exactly under greedy drafting and in distribution under
probabilistic drafting, a checkpoint read one layer off fails both, and a lossy engine is refused."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cache_server.capture.tiny_model import build_tiny_model
from cache_server.client import CacheClient
from eval_worker.checkpoints.loading import load_checkpoint
from eval_worker.cli import main
from eval_worker.evaluation.walk_types import TargetNorm
from eval_worker.exit_codes import ExitCode
from eval_worker.families.dflash.drafter import DFlashDrafter
from eval_worker.parity.distribution import accepted_histogram, distribution_check, kept_accepted
from eval_worker.parity.engine import SpecCounters
from eval_worker.parity.probe import log_tails
from schemas.parity import ParityReport
from schemas.report import ExpectedRounds
from schemas.sampling import SamplingParams
from testing.checkpoints import save_hf_checkpoint
from testing.servers import running_server
from testing.spec_engine import SpecCompletions, spec_engine
from tests.eval_worker.helpers import BLOCK_SIZE, HELD_OUT_TEXTS, LAYER_IDS, NEW_TOKENS, TRAIN_TEXTS

pytestmark = pytest.mark.slow

K = BLOCK_SIZE - 1
# This drafter accepts ~0.2 drafts per round at T = 1 on either reading of its layers (its one-off
# reading: 0.24 expected, 0.22 when read right): no test tells them apart there. At T = 0.1 it accepts
# ~1 per round and the one-off reading 0.67: z = 4.1 over 2 samples of 8 prompts (251 rounds).
PROBABILISTIC = ["--draft-sampling", "probabilistic", "--samples", "2"]


@pytest.fixture(scope="module")
def peaked_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared tiny target's twin with lm_head x 8: the same greedy paths and taps (so the session's
    trained drafter fits it), a peaked distribution at T = 1."""
    return build_tiny_model(tmp_path_factory.mktemp("peaked"), layers=6, hidden=64, vocab=512, seed=0, logit_scale=8.0)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, trained_drafter: DFlashDrafter) -> tuple[Path, Path]:
    """The trained drafter as saved, and the same weights saved with every layer id one below."""
    tmp = tmp_path_factory.mktemp("drafters")
    shifted = DFlashDrafter(
        dataclasses.replace(trained_drafter.cfg, target_layer_ids=tuple(k - 1 for k in LAYER_IDS)), 3
    )
    shifted.load_state_dict(trained_drafter.state_dict())
    return save_hf_checkpoint(tmp / "drafter", trained_drafter), save_hf_checkpoint(tmp / "shifted", shifted)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, peaked_target: Path) -> Iterator[str]:
    """A cache server on the peaked target with the prompts registered (greedy responses) in set `parity`."""
    with running_server(peaked_target, tmp_path_factory.mktemp("store") / "store") as url, CacheClient(url) as client:
        specs = [{"text": t, "sets": ["parity"]} for t in TRAIN_TEXTS + HELD_OUT_TEXTS]
        client.wait_ready([p.prompt_id for p in client.register(specs, max_new_tokens=NEW_TOKENS)])
        yield url


def _engine(target: Path, checkpoint: Path, server: str, **kwargs: object) -> SpecCompletions:
    with CacheClient(server) as client:
        loaded = load_checkpoint(checkpoint, client.model())
    return SpecCompletions(target, loaded, k=K, **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def engine(peaked_target: Path, checkpoints: tuple[Path, Path], server: str) -> Iterator[str]:
    with spec_engine(_engine(peaked_target, checkpoints[0], server)) as url:
        yield url


@pytest.fixture(scope="module")
def probabilistic_engine(peaked_target: Path, checkpoints: tuple[Path, Path], server: str) -> Iterator[str]:
    with spec_engine(_engine(peaked_target, checkpoints[0], server, draft_sampling="probabilistic")) as url:
        yield url


def _parity(engine: str, server: str, checkpoint: Path, out: Path, *options: str) -> tuple[int, ParityReport]:
    argv = ["parity", str(checkpoint), "--engine", engine, "--server", server, "--device", "cpu", "--out", str(out)]
    code = main([*argv, "--set", "parity", *options])
    return code, ParityReport.model_validate_json(out.read_text())


@pytest.mark.parametrize("top_p", ["1", "0.95"])
def test_greedy_drafting_at_t1_agrees_exactly_on_the_engines_own_paths(
    top_p: str,
    engine: str,
    server: str,
    checkpoints: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, report = _parity(engine, server, checkpoints[0], tmp_path / "p.json", "--temperature", "1", "--top-p", top_p)
    printed = capsys.readouterr().out
    print(printed)
    assert code == ExitCode.ok and report.agrees and report.agreeing == len(report.prompts) == 8
    assert report.probe is not None and report.probe.lossless is True and report.probe.tokens == 2 * NEW_TOKENS
    assert report.setting == ("T=1" if top_p == "1" else "T=1 top_p=0.95") and report.draft_sampling == "greedy"
    for p in report.prompts:  # exact, but where the engine counts drafts past max_tokens in the last round
        assert p.live_drafts == p.offline_rounds and p.registered_prompt_id and p.outside_support == 0
        assert p.live_accepted == p.offline_accepted or p.why.startswith("identical but the last round")
    assert sum(p.live_accepted for p in report.prompts) > 0
    assert any(0 < p.live_accepted < K * p.live_drafts for p in report.prompts)  # partial rounds too
    with CacheClient(server) as client:  # the registered paths are sampled ones, not the greedy responses
        paths = [client.prompt(p.registered_prompt_id or "") for p in report.prompts]
        greedy = [client.prompt(p.prompt_id) for p in report.prompts]
    assert all(p.sampling is not None and p.generator and p.generator.kind == "engine" for p in paths)
    assert sum(a.token_ids != b.token_ids for a, b in zip(paths, greedy, strict=True)) >= 6
    assert f"sampling {report.setting}, seed 0 per prompt, greedy drafting" in printed
    assert "probe: lossless: each of 64 output tokens at T=0.001 has a tail of p_T >= 1e-06" in printed
    assert "8 of 8 samples agree\ntau pooled (1 + accepted/drafts, vLLM): live " in printed


@pytest.mark.parametrize("temperature", ["1", "0.1"])
def test_probabilistic_drafting_agrees_in_distribution(
    temperature: str,
    probabilistic_engine: str,
    server: str,
    checkpoints: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = ["--temperature", temperature, *PROBABILISTIC]
    code, report = _parity(probabilistic_engine, server, checkpoints[0], tmp_path / "p.json", *options)
    printed = capsys.readouterr().out
    print(printed)
    check = report.distribution
    assert code == ExitCode.ok and report.agrees and check is not None and check.agrees, check
    assert f"probabilistic drafting over all {check.live_rounds} rounds" in printed
    assert len(report.prompts) == 16 and all(p.agrees is None and p.expected for p in report.prompts)
    assert check.live_rounds == sum(p.live_drafts for p in report.prompts) and check.stderr > 0
    assert check.interval[0] <= check.live_mean <= check.interval[1]


def test_a_checkpoint_read_one_layer_off_fails_both(
    engine: str, probabilistic_engine: str, server: str, checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    code, report = _parity(engine, server, checkpoints[1], tmp_path / "g.json", "--temperature", "1")
    assert code == ExitCode.disagrees and not report.agrees and report.agreeing < len(report.prompts)
    assert any("offline" in p.why and not p.agrees for p in report.prompts)
    options = ["--temperature", "0.1", *PROBABILISTIC]
    code, report = _parity(probabilistic_engine, server, checkpoints[1], tmp_path / "p.json", *options)
    assert code == ExitCode.disagrees and report.distribution is not None and not report.distribution.agrees


def test_a_lossy_engine_is_refused_by_the_probe(
    peaked_target: Path, server: str, checkpoints: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with spec_engine(_engine(peaked_target, checkpoints[0], server, lossless=False)) as lossy:
        capsys.readouterr()  # the engine's own loading output
        code, report = _parity(lossy, server, checkpoints[0], tmp_path / "p.json", "--temperature", "1")
    out, err = capsys.readouterr()
    print(err)
    assert code == ExitCode.not_lossless and out == "" and len(err.splitlines()) == 1
    probe = report.probe
    assert probe is not None and probe.lossless is False and not report.agrees and report.prompts == []
    assert probe.least_tail is not None and probe.least_tail < 1e-6 and (probe.probability or 0) <= probe.least_tail
    assert f"response position {probe.position} token {probe.token_id}" in err and "not lossless" in err


def test_t0_is_todays_parity_and_never_sends_a_registered_path(
    engine: str, server: str, checkpoints: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a T > 0 run has registered the engine's paths, T = 0 parity over every prompt (no --set) sends
    the 8 greedy prompts only, and prints today's table."""
    assert _parity(engine, server, checkpoints[0], tmp_path / "t1.json", "--temperature", "1")[0] == ExitCode.ok
    capsys.readouterr()
    argv = ["parity", str(checkpoints[0]), "--engine", engine, "--server", server, "--device", "cpu"]
    code = main([*argv, "--out", str(tmp_path / "t0.json")])
    report = ParityReport.model_validate_json((tmp_path / "t0.json").read_text())
    lines = capsys.readouterr().out.splitlines()
    assert code == ExitCode.ok and report.agreeing == len(report.prompts) == 8 and report.probe is None
    assert lines[1].split() == ["prompt", "tokens", "live", "drafts/acc", "offline", "rounds/acc", "verdict"]
    assert lines[-2] == "8 of 8 prompts agree" and lines[-1].startswith("tau pooled (1 + accepted/drafts, vLLM): live ")
    assert main([*argv, "--samples", "2"]) == ExitCode.usage  # T = 0 is greedy: one sample


def test_the_counters_give_each_rounds_accepted_drafts() -> None:
    live = SpecCounters(drafts=10, accepted=12, per_position=(6, 4, 2))  # 4 rounds of 0, 2 of 1, 2 of 2, 2 of 3
    assert accepted_histogram(live) == [4, 2, 2, 2]
    assert kept_accepted(live, 20) == 10  # 20 tokens: each of the 10 rounds added one of its own
    check = distribution_check([live], [25], [ExpectedRounds(rounds=10.0, accepted=12.0, mean_tau=2.2)])
    assert check.live_mean == check.expected_mean == 1.2 and check.agrees and check.z == 0.0
    far = distribution_check([live], [25], [ExpectedRounds(rounds=10.0, accepted=30.0, mean_tau=4.0)])
    assert not far.agrees and far.z is not None and far.z < -2.6


def test_a_tokens_tail_is_the_mass_of_the_tokens_no_more_likely() -> None:
    rows = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # RMS-normed: [sqrt 2, 0]
    lm_head = torch.tensor([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0]])  # logits sqrt 2 * [1, 0, -1]
    p = (math.sqrt(2) * torch.tensor([1.0, 0.0, -1.0])).softmax(-1)
    log_p, log_tail = log_tails(
        rows, torch.tensor([1, 0]), lm_head, TargetNorm(torch.ones(2), 0.0), SamplingParams(temperature=1.0)
    )
    assert torch.allclose(log_p.exp(), torch.stack([p[1], p[0]]))
    assert torch.allclose(log_tail.exp(), torch.stack([p[1] + p[2], torch.tensor(1.0)]))
