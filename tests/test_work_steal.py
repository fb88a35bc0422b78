"""The work-stealing queue (hetgmp.train.work_steal.ShardQueue): the owner takes batches from the
head, peers claim them from the tail, and no batch is taken twice or lost."""

from __future__ import annotations

import threading

from hetgmp.train.work_steal import ShardQueue


def test_owner_head_and_peer_tail_meet_without_overlap() -> None:
    q = ShardQueue(5)
    assert q.own(0, 0) and q.own(0, 1)
    assert q.claim(0) == 4 and q.claim(0) == 3
    assert q.own(0, 2)
    assert q.claim(0) == -1  # (the head reached the tail)
    assert not q.own(0, 3) and not q.own(0, 4)  # (claimed: the owner skips them)
    assert q.claimed == 2


def test_claims_run_ahead_of_a_lagging_owner_and_not_behind_it() -> None:
    q = ShardQueue(3)
    assert q.claim(2) == 2  # epoch 2's tail, before the owner gets there
    assert q.own(0, 0)
    assert q.own(1, 0) and q.claim(0) == -1  # (the owner moved on: epoch 0 is all taken)
    assert [q.own(2, b) for b in range(3)] == [True, True, False]


def test_concurrent_claims_take_each_batch_once() -> None:
    """An owner and three thieves race over 200 epochs of 50 batches: every batch is taken
    exactly once (the lock makes the head and tail moves atomic)."""
    n, epochs = 50, 200
    q = ShardQueue(n)
    taken: list[list[tuple[int, int]]] = [[] for _ in range(4)]
    stop = threading.Event()

    def thief(k: int) -> None:
        while not stop.is_set():
            e = q.epoch
            b = q.claim(e)
            if b >= 0:
                taken[k].append((e, b))

    threads = [threading.Thread(target=thief, args=(k,)) for k in (1, 2, 3)]
    for t in threads:
        t.start()
    for e in range(epochs):
        for b in range(n):
            if q.own(e, b):
                taken[0].append((e, b))
    stop.set()
    for t in threads:
        t.join()
    everything = [x for part in taken for x in part]
    done = [x for x in everything if x[0] < epochs]
    assert len(done) == len(set(done)) == n * epochs
    assert sum(len(p) for p in taken[1:]) > 0  # (the thieves did take some)
