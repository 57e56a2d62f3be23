"""Does the serving engine serve a drafter at the tau this tool reports? `engine.py` reads a running
vLLM (greedy tokens, its speculative-decoding counters); `compare.py` holds a prompt's live rounds
against its offline chain rounds; `run.py` runs both over the cached prompts, one request at a time."""
