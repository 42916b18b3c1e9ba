"""A queue between two threads bounded by the bytes its items hold, not by their number."""

from __future__ import annotations

import queue
import threading


class BytesQueue:
    """put() waits while the queued items hold `limit` bytes or more (one item always fits, however
    big), and gives up (returns False) once `stop` is set: the consumer has gone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.stop = threading.Event()
        self._items: queue.SimpleQueue = queue.SimpleQueue()
        self._room = threading.Condition()
        self._held = 0

    def put(self, item: object, size: int = 0) -> bool:
        with self._room:
            while self._held and self._held + size > self.limit:
                if self.stop.is_set():
                    return False
                self._room.wait(0.1)
            if self.stop.is_set():
                return False
            self._held += size
        self._items.put((item, size))
        return True

    def get(self) -> object:
        item, size = self._items.get()
        if size:
            with self._room:
                self._held -= size
                self._room.notify()
        return item
