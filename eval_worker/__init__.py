"""Evaluate drafter checkpoints (chain and tree tau) against cached target hidden states.

The data path, one subpackage per step: `checkpoints/` (strict loading, layer ids) -> `drafters/` (what
the models are built from) -> `evaluation/` (features from the cache client, drafts) -> `scoring/` (tau)
-> `reports/`; `families/` holds each drafter family's folder (its model, loading and walks) and the one
table of families; `worker/` runs jobs, `parity/` holds a serving engine's live rounds against the
offline ones, `prompt_files/` registers benchmark sets. `cli.py` parses `eval-worker` commands from
`settings.py` (shared option groups: `cli_options.py`) and runs them (`commands.py`, and
`checkpoint_commands.py` for one checkpoint against a server); `errors.py` and `exit_codes.py` are how a
run stops; `threads.py` chooses torch's CPU threads at startup; `export.py` writes a set's hidden states
as SpecForge's offline training files. Nothing here imports the server side of `cache_server`.
"""
