"""HTTP: `create_app(settings)` (`app.py`), the routes of the target, prompts and hidden states
(`routes.py`) and of jobs and the worker protocol (`jobs_routes.py`), the tensor responses they send
(`tensor_bodies.py`: one safetensors buffer `bodies.py`, decoded blocks streamed `streaming.py`, the
stored pieces `pieces_body.py`), what handlers receive (`deps.py`), the one table from errors to
responses (`error_handlers.py`), JSON 400s from the HTTP parser (`http_protocol.py`), bearer-token
auth (`auth.py`) and the leaderboard page (`page.py`).
"""
