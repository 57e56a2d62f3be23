"""4. HTTP: `create_app(settings)` (`app.py`), the routes, the response bodies, the one table from
errors to responses (`error_handlers.py`) and bearer-token auth."""
