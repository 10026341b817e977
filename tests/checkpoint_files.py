"""Damaged TensorFlow checkpoints for the resume tests."""

import os


def truncate_checkpoint(prefix):
    """Cuts every data shard of the checkpoint `prefix` (e.g. `.../ckpt-4`) to half its size: restoring
    it then fails with TensorFlow's `IndexError: Read less bytes than requested`."""
    for name in os.listdir(os.path.dirname(prefix)):
        if name.startswith(os.path.basename(prefix) + ".data"):
            path = os.path.join(os.path.dirname(prefix), name)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
