"""A worker serving in a thread of the test process, stopped gracefully when the block ends."""

from __future__ import annotations

import threading

import sqlqueue

__all__ = ["WorkerThread"]


class WorkerThread:
    """A worker serving in a background thread; ``stop()`` shuts it down gracefully."""

    def __init__(self, worker: sqlqueue.Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as error:
            self.error = error

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 30.0) -> None:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error is not None:
            raise self.error
