"""HTTP: `create_app(settings)` (`app.py`), the routes of the target, prompts and hidden states
(`routes.py`) and of jobs and the worker protocol (`jobs_routes.py`), what handlers receive
(`deps.py`), the one table from errors to responses (`error_handlers.py`), JSON 400s from the HTTP
parser (`http_protocol.py`), bearer-token auth (`auth.py`) and the leaderboard page (`page.py`).
"""
