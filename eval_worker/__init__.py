"""Evaluate drafter checkpoints (chain and DDTree tau) against cached target hidden states.

The data path, one subpackage per step: `checkpoints/` (strict loading, layer ids) -> `drafters/`
(the model) -> `evaluation/` (features from the cache client, drafts) -> `scoring/` (tau) ->
`reports/`; `worker/` runs jobs. Nothing here imports the server side of `cache_server`.
"""
