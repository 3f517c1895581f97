"""The task book's side of ``ctl undrain``: a drained node's workers get tasks again."""

from __future__ import annotations

from troupe.runtime.tasks.book import TaskBook
from troupe.runtime.tasks.state import (
    Complete,
    DrainNode,
    JobPolicy,
    Lease,
    NodeDrained,
    RequestTask,
    Resources,
    Speculation,
    SubmitJob,
    TaskSpec,
    UndrainNode,
    WorkerJoined,
    WorkerLeft,
)

POLICY = JobPolicy(speculation=Speculation(enabled=False))
CPU = Resources(cpu=8, gpu=0)


def leased(book: TaskBook, worker: str, now: float) -> list[str]:
    return [c.task_id for c in book.handle(RequestTask(worker, 1), now) if isinstance(c, Lease)]


def test_an_undrained_node_s_worker_is_leased_tasks_again() -> None:
    """Drained: no task for its worker; undrained: the worker gets the pending task."""
    book = TaskBook()
    book.handle(WorkerJoined("n1/w1", "n1", CPU, 1), 0.0)
    assert [c for c in book.handle(DrainNode("n1"), 0.0) if isinstance(c, NodeDrained)] == [NodeDrained("n1")]
    book.handle(SubmitJob("j", [TaskSpec("t", "k", 0)], POLICY), 1.0)
    assert leased(book, "n1/w1", 1.0) == []
    assert book.handle(UndrainNode("n1"), 2.0) == []
    assert leased(book, "n1/w1", 2.0) == ["t"]


def test_workers_that_join_again_after_the_drain_stopped_them_get_tasks() -> None:
    """The drain stopped the worker (it left); after undrain, its new incarnation is leased to."""
    book = TaskBook()
    book.handle(WorkerJoined("n1/w1", "n1", CPU, 1), 0.0)
    book.handle(DrainNode("n1"), 0.0)
    book.handle(WorkerLeft("n1/w1", "stopped by drain"), 1.0)
    book.handle(UndrainNode("n1"), 2.0)
    book.handle(WorkerJoined("n1/w1", "n1", CPU, 1), 3.0)
    book.handle(SubmitJob("j", [TaskSpec("t", "k", 0)], POLICY), 3.0)
    assert leased(book, "n1/w1", 3.0) == ["t"]


def test_undrain_before_the_drain_finished_cancels_its_report() -> None:
    """A node undrained while it still runs a task is not reported drained when the task ends."""
    book = TaskBook()
    book.handle(WorkerJoined("n1/w1", "n1", CPU, 1), 0.0)
    book.handle(SubmitJob("j", [TaskSpec("t", "k", 0)], POLICY), 0.0)
    lease = next(c for c in book.handle(RequestTask("n1/w1", 1), 0.0) if isinstance(c, Lease))
    assert not [c for c in book.handle(DrainNode("n1"), 1.0) if isinstance(c, NodeDrained)]
    book.handle(UndrainNode("n1"), 2.0)
    done = book.handle(Complete("n1/w1", "t", lease.lease_id, "ref"), 3.0)
    assert not [c for c in done if isinstance(c, NodeDrained)]
