"""The target, split by what each part needs: its tokenizer and chat template (`tokenizer.py`), its
heads read from the checkpoint (`heads.py`), and a `Capturer` that computes its layers (`captured.py`):
the transformers forward in this process (`hf_forward.py`, hooking every decoder layer's output under
the project's layer convention: `hooks.py`) or the serving engine's (`generation/engine_capture.py`).
`target.py` puts them together (from a directory `model_dir.py` checks first), `fingerprint.py` names
what the store holds, and `tiny_model.py` writes a tiny random target for tests and the demo.
"""
