"""A prune's hold on prompts: it takes the capture lease of the prompt it rewrites (the `captures` row a
server's capture runs under: `running`, its owner, an expiry), so that a capture and a prune of one
prompt never interleave. A prompt being captured is not held (the prune tries again later); one held
is not claimed (what is asked for meanwhile waits in `more`, and is queued when the hold ends). A
prune that dies holding a prompt leaves a lease that expires, and a server takes it over as it takes
over a dead server's, finding nothing more to compute.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from sqlalchemy import select

from cache_server.coordination.database import Database, max_seq
from cache_server.coordination.notices import Notice
from cache_server.coordination.tables import CAPTURES


class PromptHolds:
    """Capture leases of one namespace held by `owner` (a prune), each for `lease_s` at most."""

    def __init__(
        self, db: Database, namespace: str, owner: str, *, lease_s: float = 60.0, now: Callable[[], float] = time.time
    ) -> None:
        self.db, self.namespace, self.owner = db, namespace, owner
        self.lease_s, self._now = lease_s, now

    def hold(self, prompt_id: str) -> bool:
        """Take the prompt's capture lease; False while a server's capture holds it. Work queued for the
        prompt waits (in `more`) until `release`. Ordered: a new row and a first request never race."""
        now = self._now()
        with self.db.transaction(ordered=True) as c:
            mine = (CAPTURES.c.namespace == self.namespace) & (CAPTURES.c.prompt_id == prompt_id)
            row = c.execute(select(CAPTURES).where(mine).with_for_update()).first()
            lease = {"status": "running", "owner": self.owner, "lease_expires_at": now + self.lease_s}
            if row is None:  # published before the database knew it (or by a server of another database)
                seq = max_seq(c, CAPTURES.c.seq, CAPTURES.c.namespace == self.namespace) + 1
                values = {"layers": "[]", "more": "[]", "attempts": 0, "published": True, **lease}
                c.execute(CAPTURES.insert().values(namespace=self.namespace, prompt_id=prompt_id, seq=seq, **values))
                return True
            alive = row.status == "running" and (row.lease_expires_at or 0) > now
            if alive and row.owner != self.owner:
                return False
            # A queued capture's layers (and a dead server's, whose lease expired) wait for the release; a
            # failed prompt stays failed.
            waiting = set() if row.status == "failed" else set(json.loads(row.layers)) | set(json.loads(row.more))
            c.execute(CAPTURES.update().where(mine).values(layers="[]", more=json.dumps(sorted(waiting)), **lease))
            return True

    def release(self, prompt_id: str) -> None:
        """End the hold: the prompt is queued again if work waited for it, else back where it was (done,
        or failed with its error). Nothing if the hold had expired and a server took the prompt over."""
        with self.db.transaction() as c:
            mine = (CAPTURES.c.namespace == self.namespace) & (CAPTURES.c.prompt_id == prompt_id)
            row = c.execute(select(CAPTURES).where(mine).with_for_update()).first()
            if row is None or row.status != "running" or row.owner != self.owner:
                return
            waiting = json.loads(row.more)
            status = "queued" if waiting else "failed" if row.error is not None else "done"
            error = None if waiting else row.error
            c.execute(
                CAPTURES.update()
                .where(mine)
                .values(
                    status=status, layers=json.dumps(waiting), more="[]", owner=None, lease_expires_at=None, error=error
                )
            )
            self.db.notices.send(c, Notice("finished", self.namespace, prompt_id))
            if waiting:
                self.db.notices.send(c, Notice("queued", self.namespace))
