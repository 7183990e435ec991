"""Progress where a person waits: how often it is said (by a fake clock), how it reads on a terminal and in a
log, its rate and time left, and work whose size is unknown."""

from __future__ import annotations

import io
import re

from bus.progress import Brief, Lines, Progress, Snapshot, Tee, Terminal, Throttle, duration, for_stream, size


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def logged(total: int | None, *, unit: str = "items", noun: str = "", throttle: Throttle | None = None,
           ) -> tuple[Progress, list[str], FakeClock]:
    clock, lines = FakeClock(), list[str]()
    progress = Progress("indexing", total, Lines(lines.append), unit=unit, noun=noun,  # type: ignore[arg-type]
                        throttle=throttle or Throttle(), clock=clock)
    return progress, lines, clock


def test_a_log_gets_a_line_per_tenth_done_never_one_per_update() -> None:
    progress, lines, clock = logged(10_000, noun="entries")
    for done in range(0, 10_001, 10):  # a thousand updates, 0.01 s apart (10 s in all)
        progress.update(done)
        clock.now += 0.01
    progress.finish()
    # The first state, then each tenth, at most one a second (10 s in all), then the last: about a dozen lines.
    assert 10 <= len(lines) <= 12, lines
    assert lines[0].startswith("indexing: 0/10,000 entries (0%)")
    assert re.match(r"indexing: 1,0[01]0/10,000 entries \(10%\), 1,000/s, 9 s left$", lines[1]), lines[1]
    assert lines[-1].startswith("indexing: 10,000/10,000 entries (100%)") and lines[-1].endswith("done in 10 s")


def test_a_log_is_not_flooded_when_the_work_is_quick_and_gets_a_line_every_few_seconds_when_slow() -> None:
    progress, lines, clock = logged(1_000_000)
    for done in range(0, 300_001, 1_000):  # 30% within half a second: the first line only
        progress.update(done)
        clock.now += 0.001
    assert len(lines) == 1
    clock.now += 10  # then slow: 0.1% a second for 20 s
    for _ in range(20):
        progress.advance(1_000)
        clock.now += 1
    assert len(lines) == 1 + 4  # every 5 s (the step is far off), never more than the time rule allows


def test_a_terminal_line_is_redrawn_in_place_with_a_bar_and_ended_once_done() -> None:
    clock, out = FakeClock(), io.StringIO()
    progress = Progress("fetching the model", 4_000_000, Terminal(out, prefix="   pincer | ", width=120),
                        unit="bytes", clock=clock)
    progress.update(0)
    for _ in range(40):
        clock.now += 0.05
        progress.advance(100_000)
    progress.finish()
    text = out.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n")  # one line, redrawn
    redraws = text.split("\r")[1:]
    assert 9 <= len(redraws) <= 12  # every 0.2 s over 2 s, plus the first and the last
    assert all(r.startswith("   pincer | [") and "\x1b[K" in r for r in redraws)
    assert "[##########..........] fetching the model: 2.0 MB of 4.0 MB (50%), 2.0 MB/s, 1 s left" in text
    assert redraws[-1].startswith("   pincer | [####################] fetching the model: 4.0 MB of 4.0 MB (100%)")


def test_a_terminal_line_never_wraps_and_keeps_the_words_over_the_bar() -> None:
    out = io.StringIO()
    Progress("x" * 300, 10, Terminal(out, width=80), clock=FakeClock()).update(1)
    assert len(out.getvalue().split("\r")[1].replace("\x1b[K", "")) == 79
    narrow, clock = io.StringIO(), FakeClock()  # 80 columns: no bar, rate and time left are worth more
    progress = Progress("fetching the model", 100_000_000, Terminal(narrow, prefix="   pincer | ", width=80),
                        unit="bytes", clock=clock)
    progress.update(0)
    assert narrow.getvalue().startswith("\r   pincer | fetching the model: 0 B of 100.0 MB")
    clock.now += 10
    progress.update(50_000_000)
    assert narrow.getvalue().split("\r")[-1] == \
        "   pincer | fetching the model: 50.0 MB of 100.0 MB (50%), 5.0 MB/s, 10 s left\x1b[K"


def test_rate_and_time_left_read_as_a_person_would_say_them() -> None:
    snap = Snapshot("fetching the model", 412_300_000, 1_117_320_768, "bytes", elapsed_s=50.0)
    assert snap.line() == "fetching the model: 412.3 MB of 1.1 GB (37%), 8.2 MB/s, 1 min 25 s left"
    assert snap.brief() == "fetching the model: 0.4 of 1.1 GB"
    items = Snapshot("indexing the memory log", 4_000, 10_000, "items", elapsed_s=2.0, noun="entries")
    assert items.line() == "indexing the memory log: 4,000/10,000 entries (40%), 2,000/s, 3 s left"
    assert items.brief() == "indexing the memory log: 4,000/10,000 entries"
    assert [duration(s) for s in (0.4, 59, 60, 185, 3725)] == ["0 s", "59 s", "1 min", "3 min 5 s", "1 h 2 min"]
    assert [size(n) for n in (999, 1000, 1_500_000, 4_100_000_000)] == ["999 B", "1.0 kB", "1.5 MB", "4.1 GB"]


def test_work_of_unknown_size_shows_its_phase_and_elapsed_time() -> None:
    progress, lines, clock = logged(None)
    progress.update(0, phase="fetching its sources")
    clock.now += 2
    progress.update(0, phase="building the wheel")  # a new phase is said at once
    for _ in range(130):
        clock.now += 1
        progress.tick()  # time passes, nothing counted
    assert lines[:2] == ["indexing: fetching its sources, 0 s", "indexing: building the wheel, 2 s"]
    assert len(lines) == 2 + 130 // 5
    assert lines[-1] == "indexing: building the wheel, 2 min 12 s"
    assert progress.snapshot().brief() == "indexing: building the wheel (2 min)"
    items, counted, _ = logged(None, noun="entries")
    items.update(5_000)
    assert counted == ["indexing: 5,000 entries, 0 s"]


def test_a_total_learnt_later_is_used_from_then_on() -> None:
    progress, lines, clock = logged(None, unit="bytes")
    progress.update(500_000)
    clock.now += 6
    progress.update(1_000_000, total=4_000_000)
    assert lines[-1].startswith("indexing: 1.0 MB of 4.0 MB (25%)")


def test_a_status_hears_only_changes_of_the_brief_form_and_empty_when_done() -> None:
    published: list[str] = []
    clock, out = FakeClock(), io.StringIO()
    sink = Tee((Terminal(out, width=100), Brief(published.append)))
    progress = Progress("fetching", 1_000_000_000, sink, unit="bytes", clock=clock)
    assert sink.in_place
    for _ in range(100):
        clock.now += 0.5
        progress.advance(10_000_000)
    progress.finish()
    assert published == [f"fetching: {tenth / 10:.1f} of 1.0 GB" for tenth in range(10)] + [
        "fetching: 1.0 of 1.0 GB", ""]


def test_for_stream_chooses_by_whether_it_is_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(for_stream(Tty(), print), Terminal)
    assert isinstance(for_stream(io.StringIO(), print), Lines)


def test_what_was_there_already_counts_as_done_but_not_in_the_rate() -> None:
    progress, lines, clock = logged(4_000_000, unit="bytes")
    progress.skip(3_000_000)  # three quarters fetched by an earlier start
    clock.now += 2
    progress.advance(200_000)
    snap = progress.snapshot()
    assert snap.done == 3_200_000 and snap.rate == 100_000  # 200 kB in 2 s, not 3.2 MB in 2 s
    assert lines == ["indexing: 3.0 MB of 4.0 MB (75%), 0 s"]  # the first state; 5% more in 2 s is not due yet
    assert snap.line() == "indexing: 3.2 MB of 4.0 MB (80%), 100.0 kB/s, 8 s left"
