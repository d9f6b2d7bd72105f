"""A batched sweep's judging: its one-step field read, one-call judging, tally and cuts."""

from __future__ import annotations

import gc
import json
from datetime import datetime, timezone

import pytest

from aiocheckpoint import RetentionPolicy
from aiocheckpoint._sweep_judging import CutRows, Tally, judge_rows
from aiocheckpoint.codec import plain_record_fields, record_fields
from aiocheckpoint.errors import CheckpointCorruptedError
from aiocheckpoint.format.checksum import crc32
from aiocheckpoint.format.header import HEADER, MAGIC
from aiocheckpoint.models import AgentStatus, utcnow
from aiocheckpoint.retention import SweepReport
from aiocheckpoint.storage.base import Cut, History, HistoryRecords

FIELDS = {"step": 4, "status": "completed", "timestamp": "2026-12-07T18:40:21.013946+00:00"}


def v1(body: bytes, *, flags: int = 0, version: int = 1) -> bytes:
    """A record of ``body`` under a version-1 header with its true length and CRC-32."""
    return HEADER.pack(MAGIC, version, flags, 0, len(body), crc32(body)) + body


def fields(**changes: object) -> bytes:
    return v1(json.dumps({**FIELDS, "state": {"data": {}}, **changes}).encode())


RECORDS = {
    "sound": fields(),
    "naive time": fields(timestamp="2026-12-07T18:40:21"),
    "NaN in the state (orjson refuses it)": v1(b'{"state": NaN, ' + fields()[21:]),
    "a big int in the state": fields(state=2**70),
    "status unknown": fields(status="done"),
    "status a list": fields(status=["completed"]),
    "step a bool": fields(step=True),
    "step a string": fields(step="4"),
    "no timestamp": v1(json.dumps({"step": 1, "status": "running"}).encode()),
    "time not a time": fields(timestamp="yesterday"),
    "body a list": v1(b"[1, 2]"),
    "body not JSON": v1(b"{nope"),
    "checksum wrong": fields()[:-2] + b" }",
    "cut short": fields()[:30],
    "header only": fields()[:20],
    "flags set": v1(json.dumps(FIELDS).encode(), flags=4),
    "version 3": v1(json.dumps(FIELDS).encode(), version=3),
}


@pytest.mark.parametrize("name", list(RECORDS))
def test_the_one_step_read_agrees_with_the_general_one(name: str) -> None:
    """plain_record_fields gives record_fields' answer, or None where that one raises or
    the record needs the general path (which then reads it)."""
    data = RECORDS[name]
    quick = plain_record_fields(data)
    try:
        general = record_fields(data)
    except CheckpointCorruptedError:
        assert quick is None
        return
    assert quick is None or quick == general
    if name in ("sound", "naive time"):
        assert quick == general


def test_the_general_read_of_a_sound_record() -> None:
    """A naive timestamp reads as UTC; the status is the enum member."""
    step, status, moment = record_fields(RECORDS["naive time"])
    assert (step, status) == (4, AgentStatus.COMPLETED)
    assert moment == datetime(2026, 12, 7, 18, 40, 21, tzinfo=timezone.utc)


def _report() -> SweepReport:
    return SweepReport(dry_run=True, started_at=utcnow())


def test_a_history_judged_in_one_call() -> None:
    """The newest keep_last stay, and the newest COMPLETED and every FAILED; an unreadable
    record stays and is counted; the cut's steps and their sizes go into the tally."""
    running = [fields(step=s, status="running") for s in range(8)]
    rows = tuple(
        (step, data)
        for step, data in [
            (9, running[0]),
            (8, running[1]),
            (7, RECORDS["checksum wrong"]),
            (6, running[2]),
            (5, fields(step=5, status="completed")),
            (4, running[3]),
            (3, fields(step=3, status="failed")),
            (2, running[4]),
            (1, fields(step=1, status="completed")),
            (0, running[5]),
        ]
    )
    steps, data = zip(*rows, strict=True)
    history = History("wf", len(rows), 0, False, False, "workflow", HistoryRecords(steps, data))
    report, tally = _report(), Tally()
    cut = judge_rows(RetentionPolicy(keep_last=3), report, history, tally)
    assert cut == ("wf", (4, 2, 1, 0), 3)
    assert report.skipped_corrupted == 1
    sizes = [len(data) for _step, data in rows[5:6] + rows[7:]]
    assert (tally.steps, tally.bytes, tally.workflows) == (4, sum(sizes), 1)


def test_history_records_are_pairs_made_when_read_from_two_untracked_tuples() -> None:
    """A history's records read as ``(step, bytes)`` pairs, newest first, indexed and
    sliced; what they hold is two flat tuples the collector stops tracking at its first
    pass (a tuple of pairs stays tracked until each pair is untracked first)."""
    records = HistoryRecords.newest_first([3, 10, 0], [b"three", b"ten", b"zero"])
    assert list(records) == [(10, b"ten"), (3, b"three"), (0, b"zero")]
    assert len(records) == 3
    assert records[1] == (3, b"three")
    assert records[-1] == (0, b"zero")
    assert list(records[1:]) == [(3, b"three"), (0, b"zero")]
    assert list(HistoryRecords.newest_first([], [])) == []
    gc.collect()
    assert not gc.is_tracked(records.steps)
    assert not gc.is_tracked(records.data)
    with pytest.raises(ValueError, match="2 steps for 1 records"):
        HistoryRecords((1, 2), (b"x",))


def test_a_history_with_nothing_to_cut() -> None:
    """Nothing cut: no cut, unless effects below its oldest step are to go."""
    rows = tuple((s, fields(step=s, status="running")) for s in (2, 1, 0))
    policy, tally = RetentionPolicy(keep_last=3), Tally()
    plain = History("wf", 3, 0, False, False, "workflow", rows)
    assert judge_rows(policy, _report(), plain, tally) is None
    orphans = History("wf", 3, 0, True, False, "workflow", rows)
    assert judge_rows(policy, _report(), orphans, tally) == ("wf", (), 0)
    assert tally.steps == 0


def test_the_tally_counts_what_the_store_deleted() -> None:
    """All the cut steps deleted: the tally's own sums; some: theirs alone."""
    tally = Tally()
    tally.add("a", [5, 4], [100, 200])
    tally.add("b", [3], [50])
    assert tally.counted([("a", 5), ("a", 4), ("b", 3)]) == (3, 350, 2)
    assert tally.counted([("a", 4)]) == (1, 200, 1)
    assert tally.counted([]) == (0, 0, 0)


def test_cut_rows_make_cuts_as_used() -> None:
    """A page's rows read as Cut objects, one at a time, by index, slice or iteration."""
    rows = CutRows([("a", (3, 2), 4), ("b", (1,), None)])
    assert len(rows) == 2
    assert list(rows) == [Cut("a", (3, 2), 4), Cut("b", (1,), None)]
    assert rows[1] == Cut("b", (1,), None)
    assert list(rows[1:]) == [Cut("b", (1,), None)]
