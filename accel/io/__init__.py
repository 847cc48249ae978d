"""accel's own files on disk: durable writes and digests (:mod:`.files`), and where accel keeps its cache
(:mod:`.paths`). Torch-free, used by checkpointing, trackers, the config commands and the reports.
Importing this package imports none of its modules.
"""
