"""The decision shared by the SQLite and file group commits: when a free writer waits."""

from __future__ import annotations

from aiocheckpoint.storage.sqlite.rejoin import REJOIN_ITERATIONS, Rejoin


def test_waits_for_the_woken_callers_and_the_stragglers_at_most_two_iterations() -> None:
    rejoin = Rejoin()
    rejoin.woke(10, 1)  # ten callers woken, one straggler queued already
    assert rejoin.wait(1, 256)
    assert rejoin.wait(10, 256)  # ten queued: one woken caller still missing
    assert not rejoin.wait(10, 256)  # REJOIN_ITERATIONS spent: go with what is queued
    assert REJOIN_ITERATIONS == 2


def test_goes_at_once_with_none_or_all_of_them_queued() -> None:
    rejoin = Rejoin()
    assert not rejoin.wait(1, 256)  # no batch yet
    rejoin.woke(1, 0)
    assert not rejoin.wait(1, 256)  # C=1: its one caller is back
    rejoin.woke(10, 0)
    assert not rejoin.wait(0, 256)  # nothing queued: the writer goes idle
    assert not rejoin.wait(10, 256)
    rejoin.woke(300, 0)
    assert not rejoin.wait(256, 256)  # a full batch is queued


def test_a_new_batch_restarts_the_count() -> None:
    rejoin = Rejoin()
    rejoin.woke(10, 0)
    assert rejoin.wait(5, 256) and rejoin.wait(5, 256) and not rejoin.wait(5, 256)
    rejoin.woke(10, 0)
    assert rejoin.wait(5, 256)
