"""Test plug-in: moments at which a test can signal a run, each announced by
a marker file (env vars, all optional):

- ``SLOW_IMPORT_MARKER``: this module, imported while the config loads
  (before the run begins), creates the file and sleeps 60 s;
- ``SLOW_DATA_MARKER``: data set ``slow_blobs`` (tiny_blobs' ``blobs``)
  creates the file and sleeps 60 s in its load, inside the run's start-up;
- ``LINGER_MARKER``: after the run's last line, as the process exits
  (atexit), creates the file and waits 10 s.

Loaded with ``plugins=[tests/plugins/process_hooks.py]``."""

import atexit
import os
import time
from pathlib import Path

from fedclust.config import load_plugin
from fedclust.data.registry import register

load_plugin(str(Path(__file__).with_name("tiny_blobs.py")))
from fedclust.data.registry import get as _get_data  # noqa: E402

Blobs = type(_get_data("blobs"))


def _mark(var: str) -> bool:
    path = os.environ.get(var)
    if not path:
        return False
    Path(path).touch()
    return True


@register
class SlowBlobs(Blobs):
    name = "slow_blobs"

    def load(self, cfg, num_clients, seed, ids, device):
        if _mark("SLOW_DATA_MARKER"):
            time.sleep(60)
        return super().load(cfg, num_clients, seed, ids, device)


if os.environ.get("LINGER_MARKER"):
    atexit.register(lambda: _mark("LINGER_MARKER") and time.sleep(10))

if _mark("SLOW_IMPORT_MARKER"):
    time.sleep(60)
