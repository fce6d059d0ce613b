"""Sizes that the transport and the memory estimates of algorithms share
(one number each, read by both sides)."""

# The most a checkpoint's gather moves per collective when it collects wide rows on rank 0 (fedclust.state), and
# what FPFC's memory check adds for it (fedclust.algorithms.fpfc).
CHECKPOINT_BLOCK_BYTES = 256 * 2**20
