"""Reader of IDX files (the MNIST / Fashion-MNIST format), gzipped or not.

Format (LeCun's MNIST page): a 4-byte magic ``0 0 T D``, where T is the
element type code and D the number of dimensions, then D big-endian uint32
sizes, then the elements in big-endian C order.  Used for the Fashion-MNIST
files of the Debian package ``dataset-fashion-mnist`` (docs/algorithms.md), which
machines without internet rely on.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import torch

# IDX type code -> big-endian numpy dtype
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"


def read_bytes(path: str | Path) -> bytes:
    """The file's bytes, gunzipped when the file starts with the gzip magic."""
    raw = Path(path).read_bytes()
    return gzip.decompress(raw) if raw[:2] == _GZIP_MAGIC else raw


def parse_idx(data: bytes, name: str = "<bytes>") -> torch.Tensor:
    """Decode IDX bytes into a tensor of the file's shape (native byte order)."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{name}: not an IDX file (magic bytes {data[:4]!r})")
    code, ndim = data[2], data[3]
    if code not in IDX_DTYPES:
        raise ValueError(f"{name}: unknown IDX element type 0x{code:02x}")
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dtype = IDX_DTYPES[code]
    count = int(np.prod(shape, dtype=np.int64))
    if len(data) - header != count * dtype.itemsize:
        raise ValueError(
            f"{name}: header says shape {shape} ({count * dtype.itemsize} bytes) "
            f"but the file holds {len(data) - header} bytes of data"
        )
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(shape)
    return torch.from_numpy(arr.astype(dtype.newbyteorder("="), copy=True))


def read_idx(path: str | Path) -> torch.Tensor:
    """Read one IDX file (``.gz`` or plain) into a tensor."""
    return parse_idx(read_bytes(path), name=str(path))


def find_idx_file(folder: str | Path, stem: str) -> Path | None:
    """``folder/stem`` or ``folder/stem.gz``, whichever exists (plain first)."""
    for name in (stem, stem + ".gz"):
        p = Path(folder) / name
        if p.is_file():
            return p
    return None
