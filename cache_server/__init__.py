"""Run a target LLM once per prompt, keep every decoder layer's output in Zarr, serve any layer set.

The data path, one subpackage per step: `capture/` (the target's forward) and `generation/`
(responses from a serving engine) -> `compute/` (what to compute, once) -> `store/` (Zarr) ->
`api/` (HTTP); `coordination/` is the database the servers of one store share, `jobs/` queues
checkpoint evaluations and `client/` is the light client (no torch) the other packages import;
`engine_connector/` is run by the serving engine, not imported (its hidden-states KV connector).
`cli.py` starts the server (`cache-server serve`) from `settings.py` (as options by `cli_source.py`,
which `eval-worker` shares); `errors.py` holds the errors
each mapped to one `ErrorCode`; `torch_utils.py` is torch's side of dtype and device names, and
`sampling.py` the target's sampling distribution at a setting (temperature, min-p, top-k, top-p),
both shared with the workers.
"""
