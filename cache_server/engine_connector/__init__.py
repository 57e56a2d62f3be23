"""vLLM's side of engine capture, run by the engine rather than imported by the server (standard
library and vLLM only): `hsc_vllm_connector.py` is a KV connector module (`kv_connector_module_path`)
that writes each prefilled request's aux hidden states to a safetensors file the cache server ingests,
and `hsc_vllm_launch.py` starts vLLM's server with it, the aux ids derived from `--capture-layers`.
"""
