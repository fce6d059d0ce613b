"""Read an offline W&B run file (``run-<id>.wandb``) for the tests.

wandb 0.31 has no public reader of offline runs.  The file is a 7-byte
header (``:W&B``, magic 0xBEE1, version 0) followed by LevelDB-log framing:
32 KiB blocks of chunks, each with a 7-byte header (CRC-32C, length
little-endian u16, type 1 full / 2 first / 3 middle / 4 last) whose payloads
make up serialized ``wandb.proto.wandb_internal_pb2.Record`` messages."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
FILE_HEADER = 7
CHUNK_HEADER = 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pending, pos = [], b"", FILE_HEADER
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:          # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + CHUNK_HEADER])
        pos += CHUNK_HEADER
        if kind == 0:                    # zero padding up to the block's end
            pos += left - CHUNK_HEADER
            continue
        chunk = data[pos:pos + length]
        pos += length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
            pending = b""
    parsed = []
    for raw in out:
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(raw)
        parsed.append(rec)
    return parsed


def run_file(run_dir: Path) -> list[Path]:
    """The offline run files under a fedclust run directory, oldest first."""
    return sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))


def history(recs) -> list[dict]:
    """Each history row as {key: value} with its ``_step``."""
    rows = []
    for rec in recs:
        if rec.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            row["_step"] = rec.history.step.num if rec.history.HasField("step") else row.get("_step")
            rows.append(row)
    return rows


def summary(recs) -> dict:
    out: dict = {}
    for rec in recs:
        if rec.WhichOneof("record_type") == "summary":
            for item in rec.summary.update:
                out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out


def run_info(recs):
    for rec in recs:
        if rec.WhichOneof("record_type") == "run":
            return rec.run
    raise AssertionError("no run record")
