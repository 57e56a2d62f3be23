"""KV connectors that misbehave on purpose, loaded by a test's vLLM engine (on its PYTHONPATH beside
`cache_server/engine_connector/`), never imported by the tests: `hsc_wrong_tokens_connector.py` writes
token ids other than the prompt's; `hsc_slow_write_connector.py` does too, and delays a write past the
engine's answer (the window a crash between the two lands in).
"""
