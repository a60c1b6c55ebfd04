"""``tensorboard``: event files under ``RUN_DIR/tensorboard/`` (``tensorboard --logdir``).

Written with the tensorboard package's own event writer and protocol buffers: no torch,
no TensorFlow. A resumed run adds a new event file beside the old ones; TensorBoard reads
them as one run."""

from __future__ import annotations

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter

FOLDER = "tensorboard"


class Sink:
    name = "tensorboard"

    def __init__(self, run_dir, config) -> None:
        self._writer = EventFileWriter(str(run_dir / FOLDER))

    def write(self, step: int, scalars: dict[str, float], wall: float) -> None:
        values = [Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
        self._writer.add_event(Event(wall_time=wall, step=step, summary=Summary(value=values)))
        self._writer.flush()  # watched live: on disk at every update

    def close(self) -> None:
        self._writer.close()
