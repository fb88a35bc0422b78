"""The whole step's fixed capacities (``padded.whole.WholeStep._grow``): the first epoch's are
tight (its largest batch, rounded to the quantum); when a later, reshuffled epoch outgrows them
they grow with room (``GROWTH_ROOM``), so the next epochs, whose largest batches outgrow the
running maximum by a little if at all, take no more rebuilds (each one captures every graph
again: ~0.5 s on 2 H100s)."""

from __future__ import annotations

from types import SimpleNamespace

from hetgmp.embedding.padded import whole
from hetgmp.embedding.padded.whole import QUANTUM, WholeStep


def _fake() -> SimpleNamespace:
    fake = SimpleNamespace(
        padded=SimpleNamespace(frozen=None), max_q=None,
        ctx=SimpleNamespace(bound=100, opt=SimpleNamespace(state_width=1)),
    )  # fmt: skip
    fake._deferred_since_grow = lambda: False
    return fake


def test_the_first_epoch_is_tight_and_a_growth_leaves_room() -> None:
    fake, n = _fake(), 1 << 20
    WholeStep._grow(fake, 20_000, 135_680, 1_000, n)  # (the first epoch: tight)
    first = fake.padded.frozen
    assert (first.q, first.u) == (20_224, 135_680) and first.o == first.u
    WholeStep._grow(fake, 20_100, 135_700, 1_000, n)  # (a reshuffle's largest: a bit more)
    grown = fake.padded.frozen
    room = 135_700 + 135_700 // whole.GROWTH_ROOM
    assert grown.u >= room and grown.u % QUANTUM == 0 and grown.u < room + QUANTUM
    assert grown.q == first.q  # (q still fits: unchanged, tight)
    for need_u in (136_000, 138_000, room):  # (later epochs inside the room: no rebuild)
        WholeStep._grow(fake, 20_100, need_u, 1_000, n)
        assert fake.padded.frozen is grown
    WholeStep._grow(fake, 21_000, 135_000, 1_000, n)  # (queries outgrow theirs: room too)
    assert fake.padded.frozen.q >= 21_000 + 21_000 // whole.GROWTH_ROOM
    assert fake.padded.frozen.u == grown.u  # (never shrunk)


def test_room_never_exceeds_the_batch() -> None:
    fake, n = _fake(), 4096
    WholeStep._grow(fake, 100, 4000, 10, n)
    WholeStep._grow(fake, 100, 4090, 10, n)  # (room would pass n ids: capped at n)
    assert fake.padded.frozen.u == n
