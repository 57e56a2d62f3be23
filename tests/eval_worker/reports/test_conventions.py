"""The log lines' chain tau: each sampling setting apart, T = 0 first, both conventions labelled."""

from __future__ import annotations

from eval_worker.reports.conventions import chain_line
from eval_worker.scoring.summary import round_taus, summarize_set
from schemas.report import PromptEval
from schemas.sampling import SamplingParams


def _prompt(pid: str, taus: list[int], sampling: SamplingParams | None) -> PromptEval:
    return PromptEval(prompt_id=pid, num_tokens=10, prompt_len=2, chain=round_taus(taus), sampling=sampling)


def test_the_log_line_gives_each_setting_both_ways_and_never_a_mixed_number() -> None:
    sampled = SamplingParams(temperature=0.6, top_p=0.95)
    results = [_prompt("a", [3, 3], None), _prompt("b", [1, 2, 2], None), _prompt("c", [1, 1], sampled)]
    # T=0: prompt means 3 and 5/3 -> per-prompt 7/3; pooled 11 tokens / 5 rounds. T=0.6: 1 and 1.
    assert chain_line(summarize_set(results, [], [])) == (
        "T=0: per-prompt 2.333, pooled 2.200; T=0.6 top_p=0.95: per-prompt 1.000, pooled 1.000"
    )
