"""Jobs' schedules and the scheduler's decisions, without Redis: intervals, cron in a time zone across
daylight-saving changes, one-offs, and what a scheduler that was away does with the instants it missed."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from brain.scheduler import plan
from memory.jobs import Job
from memory.schedule import Schedule, parse_duration

BERLIN = ZoneInfo("Europe/Berlin")


def at(*parts: int) -> float:
    return datetime(*parts, tzinfo=BERLIN).timestamp()  # type: ignore[misc]


def shown(instants: list[float]) -> list[str]:
    return [datetime.fromtimestamp(t, BERLIN).strftime("%m-%d %H:%M%z") for t in instants]


def test_durations_and_what_is_wrong_with_one() -> None:
    assert [parse_duration(d) for d in ("10s", "30m", "2h", "1d", "1.5h")] == [10, 1800, 7200, 86_400, 5400]
    for bad in ("10", "m", "10 minutes", "-5s"):
        with pytest.raises(ValueError, match="such as 10s, 30m or 2h"):
            parse_duration(bad)


def test_an_interval_counts_from_its_anchor() -> None:
    every = Schedule(kind="every", every_s=30, anchor=1000.0)
    assert every.next_after(999) == 1000 and every.next_after(1000) == 1030 and every.next_after(1059.9) == 1060
    assert every.instants(1000, 1100) == [1030, 1060, 1090]


def test_cron_follows_crons_rules_across_both_daylight_saving_changes() -> None:
    daily = Schedule(kind="cron", cron="30 2 * * *", tz="Europe/Berlin")
    spring = daily.instants(at(2027, 3, 26, 12, 0), at(2027, 3, 29, 12, 0))
    assert shown(spring) == ["03-27 02:30+0100", "03-28 03:00+0200", "03-29 02:30+0200"]  # 02:30 did not exist
    autumn = daily.instants(at(2027, 10, 30, 12, 0), at(2027, 11, 1, 12, 0))
    assert shown(autumn) == ["10-31 02:30+0200", "11-01 02:30+0100"]  # the repeated hour runs it once
    half_hourly = Schedule(kind="cron", cron="*/30 * * * *", tz="Europe/Berlin")
    repeated = half_hourly.instants(at(2027, 10, 31, 1, 45), at(2027, 10, 31, 1, 45) + 2 * 3600)
    assert shown(repeated) == ["10-31 02:00+0200", "10-31 02:30+0200", "10-31 02:00+0100",
                               "10-31 02:30+0100"]  # two real hours: the repeated hour's instants run twice
    weekdays = Schedule(kind="cron", cron="0 8 * * 1-5", tz="Europe/Berlin")
    assert shown(weekdays.instants(at(2027, 1, 1, 9, 0), at(2027, 1, 5, 9, 0))) == ["01-04 08:00+0100",
                                                                                    "01-05 08:00+0100"]


def test_a_one_off_and_bad_schedules_say_what_is_wrong() -> None:
    once = Schedule(kind="at", at=5000.0)
    assert once.next_after(4999) == 5000 and once.next_after(5000) is None
    with pytest.raises(ValidationError, match="is not a cron expression"):
        Schedule(kind="cron", cron="every monday")
    with pytest.raises(ValidationError, match="IANA time zone"):
        Schedule(kind="cron", cron="0 8 * * *", tz="Berlin/Mitte")
    with pytest.raises(ValidationError, match="needs its every value"):
        Schedule(kind="every")
    with pytest.raises(ValidationError, match="lowercase letters"):
        Job(name="Bad Name", owner="o", message="m", schedule=once)
    with pytest.raises(ValidationError, match="CHANNEL:CHAT"):
        Job(name="ok", owner="o", message="m", schedule=once, deliver=["telegram"])


def job(catch_up: str = "run_once", **fields: object) -> Job:
    return Job(name="tick", owner="alice", message="check", catch_up=catch_up,  # type: ignore[arg-type]
               schedule=Schedule(kind="every", every_s=60, anchor=0.0), **fields)


def test_on_time_an_instant_fires_and_the_job_moves_to_its_next() -> None:
    decided = plan(job(), 600.0, 600.8, grace_s=60)
    assert decided.fire == [600.0] and decided.records == [] and decided.next_due == 660.0


def test_after_an_outage_each_policy_records_every_instant_it_does_not_run() -> None:
    now = 1200.5  # due at 600; away until 1200.5: eleven instants, 600 ... 1200
    once = plan(job("run_once"), 600.0, now, grace_s=60)
    assert once.fire == [1200.0] and [r.due for r in once.records] == [600.0 + 60 * n for n in range(10)]
    assert {r.status for r in once.records} == {"skipped"} and "run_once" in once.records[0].reason
    assert once.next_due == 1260.0
    late_once = plan(job("run_once"), 600.0, 1230.0, grace_s=10)  # the last one is late too: still run once
    assert late_once.fire == [1200.0] and len(late_once.records) == 10
    skip = plan(job("skip"), 600.0, 1230.0, grace_s=10)
    assert skip.fire == [] and len(skip.records) == 11 and "catch-up skip" in skip.records[0].reason
    every = plan(job("all", window_s=300), 600.0, now, grace_s=60)
    assert every.fire == [960.0 + 60 * n for n in range(5)]
    assert [r.due for r in every.records] == [600.0 + 60 * n for n in range(6)]
    assert {r.status for r in every.records} == {"missed"} and "catch-up window (300s)" in every.records[0].reason


def test_a_very_long_outage_is_worked_through_in_batches() -> None:
    fast = Job(name="fast", owner="alice", message="m", schedule=Schedule(kind="every", every_s=1, anchor=0.0))
    first = plan(fast, 1.0, 5000.2, grace_s=60)
    assert first.fire == [] and len(first.records) == 1000 and first.next_due == 1001.0
    last = plan(fast, 4001.0, 5000.2, grace_s=60)
    assert last.fire == [5000.0] and len(last.records) == 999 and last.next_due == 5001.0


def test_an_instant_read_back_from_the_due_set_is_never_found_again() -> None:
    anchor = 1_796_176_654.1234567  # a job made at an odd moment: its instants are not whole milliseconds
    ticking = Job(name="odd", owner="alice", message="m", schedule=Schedule(kind="every", every_s=2, anchor=anchor))
    for k in range(200):
        due = round((anchor + 2 * k) * 1000) / 1000  # as the due set keeps it: whole milliseconds
        decided = plan(ticking, due, due + 0.5, grace_s=60)
        assert decided.fire == [due] and decided.records == [], k  # fired once, not twice
        assert decided.next_due == pytest.approx(due + 2, abs=0.001)
    once = Schedule(kind="at", at=anchor)
    assert once.next_after(round(anchor * 1000) / 1000) is None  # a one-off read back is done
