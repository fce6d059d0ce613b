"""Which run a process belongs to: its run directory and a digest of its
resolved config.  The ranks compare them before their process group forms
(:func:`fedclust.dist.startup_store`), so that two runs started on one
rendezvous address never merge."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass

from fedclust.schema import CORE_KEYS, SECTIONS, to_dict


@dataclass(frozen=True)
class RunIdentity:
    """A run as one rank sees it: ``out``, its run directory (absolute; a
    default one carries its rank's start time, so ranks of one run may differ
    in it), and ``digest``, :func:`config_digest` of its config (equal on
    every rank of one run)."""

    out: str
    digest: str

    @property
    def key(self) -> str:
        """16 hex digits that name the run in its rendezvous store's keys (rank 0's identity names the run)."""
        return hashlib.sha256(f"{self.out}\n{self.digest}".encode()).hexdigest()[:16]

    def dumps(self) -> str:
        return json.dumps({"out": self.out, "digest": self.digest}, sort_keys=True)

    @classmethod
    def loads(cls, text: str | bytes) -> RunIdentity:
        """The identity :meth:`dumps` wrote; a value that is not one (another program's) reads as an empty one."""
        try:
            d = json.loads(text)
            return cls(str(d["out"]), str(d["digest"]))
        except (ValueError, TypeError, KeyError):
            return cls("", "")


def config_digest(cfg) -> str:
    """SHA-256 (hex) of the resolved config (:func:`fedclust.schema.to_dict`) as canonical JSON, the same on every
    rank of one run: every core key, and each algorithm section whose values are not all its defaults (a section
    at its defaults says nothing of the run, and which ones exist depends on the plug-ins this process loaded).
    ``out`` enters as the config named it, so two runs that differ only in a named ``out`` differ, while a default
    run directory (empty ``out``, its time stamp resolved later and per rank) enters as empty on every rank.
    Cost: one JSON dump of the config (a few KB)."""
    full = to_dict(cfg)
    kept = {k: v for k, v in full.items()
            if k in CORE_KEYS or k not in SECTIONS or v != dataclasses.asdict(SECTIONS[k]())}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def run_identity(cfg, run_dir: str) -> RunIdentity:
    """This rank's identity: its resolved run directory and its config's digest."""
    return RunIdentity(os.path.abspath(run_dir), config_digest(cfg))
