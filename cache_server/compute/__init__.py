"""What to compute, once: prompt specs as registrations (`prompt_specs.py`), kept in the registry
(`registry.py`), and sets (`sets.py`), the
single-flight batching scheduler that claims work and runs the target (`scheduler.py`), the prompts on
their way to a capture batch while their responses are generated (`responses.py`), the health of its
background loops (`health.py`) and its progress lines (`progress.py`), and the service the HTTP routes
call (`service.py`), with each prompt's status (`prompt_states.py`) and its free-space check
(`room.py`); `metrics.py` and `instances.py` name and count."""
