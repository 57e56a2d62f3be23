"""1. The target's forward: load the model, tokenize prompts, generate greedy responses, and capture
every decoder layer's output under the project's layer convention (`hooks.py`)."""
