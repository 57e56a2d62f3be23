"""Coordination between cache servers: the database (`database.py`) and the prompt side's tables
(`tables.py`) that hold registrations, prompt sets and capture leases (`captures.py`), shared by every
server on one store, and the jobs.
"""
