from __future__ import annotations

from eval_worker.scoring.summary import round_taus, summarize


def test_mean_of_means_and_tokens_per_round_differ_as_defined() -> None:
    summary = summarize([round_taus([4, 4]), round_taus([1, 1, 1, 1]), round_taus([])])
    assert summary.mean_tau == (4 + 1) / 2  # per-prompt means, averaged (DFlash convention)
    assert summary.tokens_per_round == 12 / 6
    assert (summary.total_tokens, summary.total_rounds) == (12, 6)
    assert summary.histogram == {1: 4, 4: 2}
    assert (summary.prompts_evaluated, summary.prompts_without_rounds) == (3, 1)


def test_no_rounds_at_all() -> None:
    summary = summarize([round_taus([])])
    assert (summary.mean_tau, summary.tokens_per_round, summary.histogram) == (None, None, {})
