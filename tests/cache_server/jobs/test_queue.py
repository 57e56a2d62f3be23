"""The job store: leases, retries, exactly one report per job, restarts, racing claimers."""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cache_server.errors import JobFailed, JobNotFound, LeaseLost, ReportNotReady
from cache_server.jobs.queue import JobStore
from schemas.jobs import JobProgress, JobStatus
from tests.cache_server.jobs_helpers import spec


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _report(who: str) -> str:
    return json.dumps({"by": who})


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(db_location: str, clock: Clock) -> JobStore:
    jobs = JobStore(db_location, max_attempts=3, now=clock)
    yield jobs  # type: ignore[misc]
    jobs.close()


def _submit(store: JobStore, name: str = "a", **kw: object) -> str:
    return store.submit(spec(f"/ckpt/{name}", **kw), checkpoint_relative=name).job_id  # type: ignore[arg-type]


def test_submit_claim_complete(store: JobStore, clock: Clock) -> None:
    job = store.submit(spec("/ckpt/a", prompts=["p1", "p2"], tree_budgets=[8, 32]), checkpoint_relative="a")
    assert (job.status, job.attempts, job.max_attempts, job.worker) == (JobStatus.queued, 0, 3, None)
    assert (job.prompts, job.tree_budgets, job.checkpoint) == (["p1", "p2"], [8, 32], "/ckpt/a")
    with pytest.raises(ReportNotReady, match="queued"):
        store.report(job.job_id)

    clock.t += 5
    leased = store.claim("w1", lease_s=60)
    assert leased is not None and leased.job.job_id == job.job_id
    running = leased.job
    assert (running.status, running.attempts, running.worker) == (JobStatus.running, 1, "w1")
    assert running.started_at is not None and running.lease_expires_at is not None
    assert (running.lease_expires_at - running.started_at).total_seconds() == 60
    assert store.claim("w2", lease_s=60) is None

    done = store.complete(job.job_id, leased.lease, _report("w1"))
    assert (done.status, done.lease_expires_at, done.error) == (JobStatus.done, None, None)
    assert done.finished_at is not None
    assert json.loads(store.report(job.job_id)) == {"by": "w1"}
    with pytest.raises(LeaseLost, match="done"):
        store.complete(job.job_id, leased.lease, _report("again"))
    assert json.loads(store.report(job.job_id)) == {"by": "w1"}


def test_jobs_are_claimed_oldest_first_and_listed_by_status(store: JobStore) -> None:
    ids = [_submit(store, n) for n in "abcd"]
    first = store.claim("w", 60)
    assert first is not None and first.job.job_id == ids[0]
    page = store.page(offset=1, limit=2)
    assert (page.total, [j.job_id for j in page.jobs]) == (4, ids[1:3])
    assert [j.job_id for j in store.page(status=JobStatus.running).jobs] == ids[:1]
    assert store.page(status=JobStatus.queued).total == 3


def test_unknown_job(store: JobStore) -> None:
    for call in (lambda: store.get("nope"), lambda: store.report("nope"), lambda: store.renew("nope", "x")):
        with pytest.raises(JobNotFound, match="nope"):
            call()


def test_a_stale_lease_cannot_complete_and_only_one_report_is_stored(store: JobStore, clock: Clock) -> None:
    job_id = _submit(store)
    first = store.claim("slow", lease_s=10)
    assert first is not None
    clock.t += 11  # the lease runs out: another worker takes the job over
    second = store.claim("fast", lease_s=10)
    assert second is not None and second.job.job_id == job_id
    assert (second.job.attempts, second.job.worker) == (2, "fast")
    assert second.job.error == "lease expired on worker slow (attempt 1)"

    for stale in (
        lambda: store.complete(job_id, first.lease, _report("slow")),
        lambda: store.renew(job_id, first.lease),
        lambda: store.fail(job_id, first.lease, "boom", retryable=True),
    ):
        with pytest.raises(LeaseLost, match="claimed again by worker fast"):
            stale()
    store.complete(job_id, second.lease, _report("fast"))
    with pytest.raises(LeaseLost):
        store.complete(job_id, first.lease, _report("slow"))
    assert json.loads(store.report(job_id)) == {"by": "fast"}


def test_renew_keeps_the_job(store: JobStore, clock: Clock) -> None:
    job_id = _submit(store)
    leased = store.claim("w", lease_s=10)
    assert leased is not None
    clock.t += 8
    store.renew(job_id, leased.lease)
    clock.t += 8  # 16 s after the claim, 8 after the renewal
    assert store.claim("other", 10) is None
    renewed = store.renew(job_id, leased.lease, lease_s=100)
    assert renewed.lease_expires_at is not None and renewed.lease_expires_at.timestamp() == clock.t + 100
    clock.t += 101
    taken = store.claim("other", 10)
    assert taken is not None and taken.job.attempts == 2


def test_an_expired_lease_not_yet_taken_over_still_completes(store: JobStore, clock: Clock) -> None:
    job_id = _submit(store)
    leased = store.claim("w", lease_s=10)
    assert leased is not None
    clock.t += 30
    assert store.complete(job_id, leased.lease, _report("w")).status == JobStatus.done


def test_lease_expiry_past_max_attempts_fails_the_job(db_location: str, clock: Clock) -> None:
    store = JobStore(db_location, max_attempts=2, now=clock)
    job_id = _submit(store)
    later = _submit(store, "b")
    for worker in ("w1", "w2"):
        leased = store.claim(worker, lease_s=10)
        assert leased is not None and leased.job.job_id == job_id
        clock.t += 11
    nxt = store.claim("w3", lease_s=10)  # the exhausted job is failed and skipped
    assert nxt is not None and nxt.job.job_id == later
    failed = store.get(job_id)
    assert (failed.status, failed.attempts, failed.worker) == (JobStatus.failed, 2, "w2")
    assert failed.error == "lease expired on worker w2 after 2 attempts"
    assert failed.finished_at is not None and failed.lease_expires_at is None
    with pytest.raises(JobFailed, match="after 2 attempts"):
        store.report(job_id)
    store.close()


def test_reads_report_a_job_whose_last_lease_expired_as_failed(db_location: str, clock: Clock) -> None:
    store = JobStore(db_location, max_attempts=1, now=clock)
    job_id = _submit(store)
    assert store.claim("w", 10) is not None
    clock.t += 11  # no other worker ever claims: a poller must still see the end
    assert store.get(job_id).status == JobStatus.failed
    store.close()


def test_non_retryable_failure_fails_at_once(store: JobStore) -> None:
    job_id = _submit(store)
    leased = store.claim("w", 60)
    assert leased is not None
    failed = store.fail(job_id, leased.lease, "CheckpointRefused: fc.weight [64, 192] vs [64, 128]", retryable=False)
    assert (failed.status, failed.attempts) == (JobStatus.failed, 1)
    assert failed.error == "CheckpointRefused: fc.weight [64, 192] vs [64, 128]"
    assert store.claim("w", 60) is None


def test_retryable_failures_requeue_until_attempts_run_out(store: JobStore) -> None:
    job_id = _submit(store)
    for attempt in (1, 2):
        leased = store.claim(f"w{attempt}", 60)
        assert leased is not None and leased.job.attempts == attempt
        again = store.fail(job_id, leased.lease, f"CUDA OOM {attempt}", retryable=True)
        assert (again.status, again.error, again.worker) == (
            JobStatus.queued,
            f"CUDA OOM {attempt}",
            f"w{attempt}",
        )
    leased = store.claim("w3", 60)
    assert leased is not None
    assert leased.job.error == "CUDA OOM 2"  # the last error stays visible while retrying
    final = store.fail(job_id, leased.lease, "CUDA OOM 3", retryable=True)
    assert (final.status, final.attempts) == (JobStatus.failed, 3)
    assert final.error == "CUDA OOM 3 (gave up after 3 attempts)"


def test_restart_keeps_jobs_leases_and_reports(db_location: str, clock: Clock) -> None:
    path = db_location
    store = JobStore(path, now=clock)
    done, running, queued = (_submit(store, n) for n in "abc")
    first = store.claim("w", 600)
    second = store.claim("w", 600)
    assert first is not None and second is not None
    store.complete(done, first.lease, _report("w"))
    store.close()

    reopened = JobStore(path, now=clock)
    states = {j.job_id: j for j in reopened.page().jobs}
    assert [states[i].status for i in (done, running, queued)] == [
        JobStatus.done,
        JobStatus.running,
        JobStatus.queued,
    ]
    assert json.loads(reopened.report(done)) == {"by": "w"}
    assert reopened.complete(running, second.lease, _report("w")).status == JobStatus.done  # lease survived
    last = reopened.claim("w2", 60)
    assert last is not None and last.job.job_id == queued
    reopened.close()


def _grab(store: JobStore, name: str, barrier: threading.Barrier) -> str | None:
    barrier.wait()
    leased = store.claim(name, 60)
    return leased.job.job_id if leased is not None else None


def test_racing_claimers_never_share_a_job(db_location: str) -> None:
    """Four threads on two stores (as two server processes would), released together, 40 times."""
    path = db_location
    a, b = JobStore(path), JobStore(path)
    for _ in range(40):
        job_id = _submit(a)
        barrier = threading.Barrier(4)
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(_grab, (a, b, a, b), "wxyz", [barrier] * 4))
        assert sorted(got, key=str) == sorted([job_id, None, None, None], key=str)
    a.close()
    b.close()


def test_many_claimers_finish_every_job_exactly_once(db_location: str) -> None:
    path = db_location
    setup = JobStore(path)
    ids = {_submit(setup, f"c{i}") for i in range(40)}
    stores = [JobStore(path), JobStore(path)]  # threads share a store and stores share the file
    completed: Counter[str] = Counter()
    lock = threading.Lock()

    def worker(n: int) -> None:
        store = stores[n % 2]
        while (leased := store.claim(f"w{n}", 600)) is not None:
            store.complete(leased.job.job_id, leased.lease, _report(f"w{n}"))
            with lock:
                completed[leased.job.job_id] += 1

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert completed == Counter(dict.fromkeys(ids, 1))
    final = setup.page(limit=1000)
    assert {j.job_id for j in final.jobs} == ids
    assert all(j.status == JobStatus.done and j.attempts == 1 for j in final.jobs)
    for s in [setup, *stores]:
        s.close()


def test_a_version_1_job_database_is_migrated_through_every_version_and_keeps_its_jobs(tmp_path: Path) -> None:
    """A database written before EAGLE-3 options existed (schema 1) opens, keeps its jobs, takes new ones."""
    import sqlite3

    path = tmp_path / "jobs.sqlite"
    v1 = """CREATE TABLE jobs (
        job_id TEXT PRIMARY KEY,
        status TEXT NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed')),
        checkpoint TEXT NOT NULL, checkpoint_relative TEXT NOT NULL, prompts TEXT NOT NULL,
        tree_budgets TEXT NOT NULL, target_layer_ids TEXT, block_size INTEGER, target_fingerprint TEXT,
        attempts INTEGER NOT NULL DEFAULT 0, max_attempts INTEGER NOT NULL, worker TEXT, lease TEXT,
        lease_s REAL, created_at REAL NOT NULL, started_at REAL, finished_at REAL, lease_expires_at REAL,
        error TEXT, report TEXT
    ); CREATE INDEX jobs_by_status ON jobs (status);"""
    with sqlite3.connect(path) as conn:
        conn.executescript(v1)
        for job_id in ("old", "older"):  # rowid order is submission order, kept as `seq`
            conn.execute(
                "INSERT INTO jobs (job_id, status, checkpoint, checkpoint_relative, prompts, tree_budgets, "
                f"max_attempts, created_at) VALUES ('{job_id}', 'queued', '/r/a.pt', 'a.pt', '\"all\"', '[4]', 3, 1.0)"
            )
        conn.execute("PRAGMA user_version = 1")
    conn.close()
    store = JobStore(path)
    old = store.get("old")
    assert (old.tree_budgets, old.steps, old.eagle_trees, old.layer_convention, old.sets) == ([4], None, [], None, [])
    new = store.submit(spec("/r/b.pt", steps=4, eagle_trees=["10,7,60"]), checkpoint_relative="b.pt")
    assert (store.get(new.job_id).steps, store.get(new.job_id).eagle_trees) == (4, ["10,7,60"])
    assert [j.job_id for j in store.page().jobs] == ["old", "older", new.job_id]
    store.close()


def _progress(walked: int, total: int = 4) -> JobProgress:
    return JobProgress(prompts_walked=walked, prompts_total=total, rounds=10 * walked, elapsed_s=2.0 * walked)


def test_renewals_carry_the_walks_progress_into_the_jobs_state(store: JobStore, clock: Clock) -> None:
    job_id = _submit(store)
    leased = store.claim("w", lease_s=60)
    assert leased is not None and leased.job.progress is None
    clock.t += 7
    state = store.renew(job_id, leased.lease, progress=_progress(1))
    assert state.progress is not None and (state.progress.prompts_walked, state.progress.rounds) == (1, 10)
    assert state.progress.reported_at is not None and state.progress.reported_at.timestamp() == clock.t
    store.renew(job_id, leased.lease)  # a renewal without progress keeps the last
    assert store.get(job_id).progress == state.progress
    assert store.page(status=JobStatus.running).jobs[0].progress == state.progress
    clock.t += 61  # expired and claimed again: a new attempt starts with no progress
    again = store.claim("w2", lease_s=60)
    assert again is not None and again.job.progress is None


def test_deleting_a_running_job_cancels_it_at_its_workers_next_word(store: JobStore, clock: Clock) -> None:
    job_id = _submit(store)
    leased = store.claim("w", lease_s=60)
    assert leased is not None
    cancelling = store.delete(job_id)
    assert cancelling is not None and cancelling.status == JobStatus.cancelling
    assert store.delete(job_id) == cancelling  # asked again: still cancelling, not removed
    assert [j.job_id for j in store.page(status=JobStatus.cancelling).jobs] == [job_id]
    assert store.page(status=JobStatus.running).jobs == []
    renewed = store.renew(job_id, leased.lease, progress=_progress(2))
    assert renewed.status == JobStatus.cancelling  # what tells the worker to stop
    store.fail(job_id, leased.lease, "stopped after 2 of 4 prompts", retryable=True)  # never queued again
    done = store.get(job_id)
    assert (done.status, done.error) == (JobStatus.cancelled, "cancelled: stopped after 2 of 4 prompts")
    assert done.finished_at is not None and store.claim("w", lease_s=60) is None
    with pytest.raises(JobFailed, match="was cancelled"):
        store.report(job_id)
    assert [j.job_id for j in store.page(status=JobStatus.cancelled).jobs] == [job_id]
    assert store.page(status=JobStatus.failed).jobs == []
    assert store.delete(job_id) is None  # a finished job is removed
    with pytest.raises(JobNotFound):
        store.get(job_id)


def test_a_cancelling_job_whose_worker_died_ends_cancelled_not_claimed_again(store: JobStore, clock: Clock) -> None:
    job_id = _submit(store)
    assert store.claim("w", lease_s=60) is not None
    store.delete(job_id)
    clock.t += 61
    assert store.claim("w2", lease_s=60) is None
    state = store.get(job_id)
    assert state.status == JobStatus.cancelled and "lease expired on worker w before it stopped" in (state.error or "")


def test_a_cancelled_job_that_finished_first_keeps_its_report(store: JobStore) -> None:
    job_id = _submit(store)
    leased = store.claim("w", lease_s=60)
    assert leased is not None
    store.delete(job_id)
    assert store.complete(job_id, leased.lease, _report("w")).status == JobStatus.done
    assert json.loads(store.report(job_id)) == {"by": "w"}
