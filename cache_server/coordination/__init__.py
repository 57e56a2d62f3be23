"""5. Coordination between cache servers: the database (`database.py`) that holds registrations,
prompt sets and capture leases (`captures.py`), shared by every server on one store, and the jobs."""
