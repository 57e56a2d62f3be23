"""Run a target LLM once per prompt, keep every decoder layer's output in Zarr, serve any layer set.

The data path, one subpackage per step: `capture/` (the target's forward) and `generation/`
(responses from a serving engine) -> `compute/` (what to compute, once) -> `store/` (Zarr) ->
`api/` (HTTP) ; `jobs/` queues checkpoint evaluations.
Other packages import only `cache_server.client` (light: no torch) and, for torch device and dtype
choice, `cache_server.torch_utils`. The server starts with `cache-server serve`.
"""
