"""The cycle collector, set for a server that holds thousands of streams open at once.

Nearly everything a request allocates is freed by reference counting; the collector only finds
cycles. It counts container objects allocated less those freed, never below zero, and scans the
young generation when the count passes the first threshold, the middle one every so many young
scans. A scan's cost is the objects it finds alive: with thousands of streams open, each holds a
few objects across every wait (its coroutines, the future it waits on), so each young scan finds
tens of thousands alive, promotes them, and the middle scan walks every stream's state again.

Measured with 8,000 slow streams on one worker, the time of each scan read through gc.callbacks:
with 20,000 young and CPython's middle threshold (10), the scans took 1.0 to 3.4 µs a relayed chunk
(8 runs; 10 to 11 % of the worker's CPU in the runs that held the most streams at once), with a
middle scan of 70 to 140 ms every few seconds, and collected nothing; with 50,000 and 100, 0.5 to
0.95 µs (5 runs), and no middle scan in the burst. A request at c=1 counts the same instructions
either way (1.27M). 20,000 young, against CPython's 700, had saved about 8 % of a plain request.

What it costs: cyclic garbage waits longer to be found (up to 50,000 allocations in the young
generation, a hundred young scans in the middle one), and a middle scan, ten times rarer, may walk
more: what every open stream holds, where a full scan (the oldest generation, left as CPython sets
it) walks that too.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
MIDDLE_THRESHOLD = 100


def settle_collector() -> None:
    """Collect what start-up left, keep what it built (documents, compiled tables, modules: they
    live as long as the process) out of every later scan, and set the thresholds."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, gc.get_threshold()[2])
