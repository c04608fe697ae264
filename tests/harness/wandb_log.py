"""Read an offline wandb run back: the records of its run-<id>.wandb log.

The log is LevelDB's log format after a 7-byte wandb header: 32 KiB blocks of chunks, each a
7-byte header (checksum, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) and
data; a record is one full chunk or a first..last sequence, and parses as a wandb Record."""

from __future__ import annotations

import time
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


def read_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path}: not a wandb log (starts {data[:8]!r})")
    records, pos, parts = [], HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        length = int.from_bytes(data[pos + 4 : pos + 6], "little")
        kind = data[pos + 6]
        if pos + HEADER + length > len(data):  # the writer has not finished this chunk yet
            break
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0:
            continue
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            records.append(record)
    return records


def wait_for_exit(path: Path, timeout_s: float = 60.0) -> list:
    """The log's records once its exit record is there: wandb's service process writes the log
    and can finish a moment after run.finish() returns on a loaded machine."""
    from google.protobuf.message import DecodeError

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = read_records(path)
        except DecodeError:  # a chunk caught mid-write parses as corrupt; past the deadline it is
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)
