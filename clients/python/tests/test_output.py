"""The runner's output buffer and capture: lines batched and numbered in order, an open line sent
after one flush, the tail kept and the drop counted past the total, output held back (not dropped)
past the rate, and ``print`` and ``logging`` routed to the task whose handler runs in the context,
anything else left where it went."""

from __future__ import annotations

import io
import logging
import sys

from switchyard_runner.output import LOG, STDERR, STDOUT, OutputBuffer, OutputLimits, current_output, install_capture


def collect(limits: OutputLimits = OutputLimits(), clock=None):
    batches: list[list] = []
    kwargs = {"clock": clock} if clock else {}
    return OutputBuffer(limits, batches.append, **kwargs), batches


def chunks_of(batches: list[list]) -> list:
    return [chunk for batch in batches for chunk in batch]


def test_lines_are_batched_and_numbered_in_order() -> None:
    buffer, batches = collect()
    buffer.write(STDOUT, "one\ntw")
    buffer.write(STDOUT, "o\n")
    buffer.write(STDERR, "oops\n")
    buffer.write(STDOUT, "three\n")
    assert batches == [], "nothing before a flush"
    buffer.flush()
    seen = [(c.stream, c.sequence, c.text) for c in chunks_of(batches)]
    assert seen == [(STDOUT, 1, "one\ntwo\n"), (STDERR, 2, "oops\n"), (STDOUT, 3, "three\n")]


def test_an_open_line_waits_one_flush_then_goes_as_it_is() -> None:
    buffer, batches = collect()
    buffer.write(STDOUT, "progress 10%")
    buffer.flush()
    assert batches == []
    buffer.flush()
    assert chunks_of(batches)[0].text == "progress 10%"
    buffer.write(LOG, "last words")
    assert buffer.flush(last=True)
    assert chunks_of(batches)[-1].text == "last words"
    buffer.write(STDOUT, "after the end\n")
    assert not buffer.flush()
    assert len(chunks_of(batches)) == 2


def test_past_the_total_the_tail_is_kept_and_the_drop_counted() -> None:
    limits = OutputLimits(max_bytes=100, bytes_per_sec=1 << 30, burst_bytes=1 << 30, tail_bytes=30)
    buffer, batches = collect(limits)
    written = 0
    for n in range(1000):
        line = f"line {n:04}\n"
        written += len(line)
        buffer.write(STDOUT, line)
    buffer.flush()
    buffer.flush(last=True)
    chunks = chunks_of(batches)
    text = "".join(c.text for c in chunks)
    dropped = sum(c.dropped_bytes for c in chunks)
    assert text.startswith("line 0000\n") and text.endswith("line 0999\n")
    assert len(text) + dropped == written
    assert len(text) <= 100 + 30
    marked = next(c for c in chunks if c.dropped_bytes)
    assert marked.text.startswith("line 09")


def test_past_the_rate_output_waits_in_the_tail_until_the_rate_allows() -> None:
    now = [0.0]
    limits = OutputLimits(bytes_per_sec=100, burst_bytes=100, tail_bytes=1000)
    buffer, batches = collect(limits, clock=lambda: now[0])
    buffer.write(STDOUT, "a" * 99 + "\n")
    buffer.write(STDOUT, "b\n")
    buffer.flush()
    assert [len(c.text) for c in chunks_of(batches)] == [100]
    now[0] = 1.0
    buffer.flush()
    later = chunks_of(batches)[1]
    assert (later.text, later.dropped_bytes) == ("b\n", 0), "held back, not dropped"


def test_characters_are_counted_in_bytes_and_never_cut() -> None:
    limits = OutputLimits(max_bytes=10, bytes_per_sec=1 << 30, burst_bytes=1 << 30, tail_bytes=6)
    buffer, batches = collect(limits)
    buffer.write(STDOUT, "éé\n")  # 5 bytes
    buffer.write(STDOUT, "ééé\néé\n")  # 7 + 5 bytes: past the total
    buffer.flush(last=True)
    chunks = chunks_of(batches)
    text = "".join(c.text for c in chunks)
    assert text == "éé\néé\n"
    assert sum(c.dropped_bytes for c in chunks) == 7


def test_print_and_logging_in_a_handler_reach_its_task_only() -> None:
    original = io.StringIO()
    saved = sys.stdout
    sys.stdout = original
    try:
        install_capture()
        buffer, batches = collect()
        print("before the handler")
        token = current_output.set(buffer)
        try:
            print("from the handler")
            logging.getLogger("app").warning("careful")
            logging.getLogger("switchyard_runner.runner").warning("the runner's own")
        finally:
            current_output.reset(token)
        print("after the handler")
        buffer.flush(last=True)
    finally:
        sys.stdout = saved
    assert original.getvalue() == "before the handler\nafter the handler\n"
    seen = [(c.stream, c.text) for c in chunks_of(batches)]
    assert seen == [(STDOUT, "from the handler\n"), (LOG, "WARNING app: careful\n")]
