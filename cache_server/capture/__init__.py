"""The target's forward: load the model, tokenize prompts and generate greedy responses (`target.py`),
capture every decoder layer's output under the project's layer convention (`hooks.py`), the target's
identity (`fingerprint.py`), and a tiny random target for tests and the demo (`tiny_model.py`).
"""
