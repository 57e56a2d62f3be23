"""Does the serving engine serve a drafter at the tau this tool reports? `engine.py` reads a running
vLLM (greedy or seeded sampled tokens, its speculative-decoding counters); `compare.py` holds a prompt's
live rounds against its offline chain rounds; `run.py` runs both over the cached prompts, one request at
a time. At T > 0: `probe.py` asks first whether the engine's speculative sampling is lossless,
`paths.py` registers the engine's output paths on the cache server, `sampled.py` walks them offline and
compares, `distribution.py` judges probabilistic drafting over all rounds. `report.py` puts the rows
together, `table.py` prints them, `options.py` is the command line's part."""
