"""The cycle collector as the gateway sets it on start-up (gateway/core/collector.py): what a
burst of streams holds open is not walked again and again by the middle generation, start-up's
objects are frozen out of every scan, and cyclic garbage is still found."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import Iterator

from asgi_lifespan import LifespanManager

from gateway.app import build_gateway
from gateway.config.settings import Settings
from gateway.core.collector import MIDDLE_THRESHOLD, YOUNG_THRESHOLD, settle_collector


@contextlib.contextmanager
def collector_restored() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@contextlib.contextmanager
def scans_counted() -> Iterator[list[int]]:
    """The generation of each scan the collector runs meanwhile."""
    scans: list[int] = []

    def heard(phase: str, info: dict) -> None:
        if phase == "start":
            scans.append(info["generation"])

    gc.callbacks.append(heard)
    try:
        yield scans
    finally:
        gc.callbacks.remove(heard)


def streams_held(count: int, size: int = 80) -> list[list[list]]:
    """What `count` open streams hold across their waits (`size` objects the collector tracks
    each, about half of what one holds in the gateway), built while each stream's chunks come and
    go (a few container objects a chunk, freed as the next one arrives)."""
    held = []
    for _ in range(count):
        state = [[] for _ in range(size - 1)]
        for _ in range(8):
            chunk = [{"delta": "x"}, ["id", "model"]]
            state[0] = chunk
        held.append(state)
    return held


def test_a_burst_of_streams_is_not_walked_by_the_middle_generation():
    with collector_restored():
        gc.collect()
        settle_collector()
        with scans_counted() as scans:
            held = streams_held(8_000)  # 640,000 objects held
        assert len(held) == 8_000
        assert scans.count(1) == 0 and scans.count(2) == 0, scans
        assert 1 <= scans.count(0) <= 13, scans
        del held
        # with CPython's thresholds, the same burst runs young scans by the hundred and middle
        # ones by the dozen, each walking every stream seen so far
        gc.set_threshold(700, 10, 10)
        with scans_counted() as scans:
            streams_held(8_000)  # held while it is built
        assert scans.count(1) >= 10


def test_start_up_sets_the_collector_and_freezes_what_it_built():
    with collector_restored():
        gc.unfreeze()
        gc.set_threshold(700, 10, 10)
        gateway = build_gateway(Settings())

        async def started() -> tuple[tuple[int, int, int], int]:
            async with LifespanManager(gateway.app):
                return gc.get_threshold(), gc.get_freeze_count()

        thresholds, frozen = asyncio.run(started())
        assert thresholds == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, 10)  # the oldest left as it was
        assert frozen > 10_000  # the documents, the compiled tables, the modules


def test_cyclic_garbage_is_still_found():
    class Node:
        pass

    with collector_restored():
        settle_collector()
        node = Node()
        node.self = node  # a cycle: reference counting alone never frees it
        gone = weakref.ref(node)
        del node
        with scans_counted() as scans:
            held = streams_held(YOUNG_THRESHOLD // 40)  # more objects than a young scan waits for
        assert len(held) * 80 > YOUNG_THRESHOLD
        assert 0 in scans
        assert gone() is None
