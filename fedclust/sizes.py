"""Sizes that the transport and the memory estimates of algorithms share
(one number each, read by both sides)."""

# The most a checkpoint's gather moves per collective when it collects wide rows on rank 0 (fedclust.state), and
# what FPFC's memory check adds for it (fedclust.algorithms.fpfc).
CHECKPOINT_BLOCK_BYTES = 256 * 2**20


def host_memory_available() -> int:
    """Bytes of host memory free for a new allocation: /proc/meminfo's MemAvailable (Linux), else 0 (unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
