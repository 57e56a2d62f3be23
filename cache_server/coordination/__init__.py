"""Coordination between cache servers on one store: the database (`database.py`: lock-free reads,
row-locked writes), every table it holds (`tables.py`), the schema's version and migrations
(`schema.py`), capture work under leases (`captures.py`), a prune's hold on those leases (`holds.py`),
and the notices that wake other servers when work is queued or finished (`notices.py`).
"""
