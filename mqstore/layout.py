"""Names, sizes and record constants of a store directory, defined once (docs/format.md).

A leaf module: it imports nothing from mqstore, so every layer (the log, the queues, the
services, the node, the tools) can take its names from here. The compiled kernels have their
own copies in ``ext/mq_record.pxd`` and ``ext/include``; the pure-Python twins in
``mqstore/twin`` keep theirs on purpose (an oracle written from the spec, not from this code).
"""

from __future__ import annotations

__all__ = [
    "ABORT_NAME", "BLANK_MAGIC_CODE", "CHECKPOINT_NAME", "COMMITLOG_DIR", "CONFIG_NAME", "CONSUMEQUEUE_DIR",
    "CLEAN_CLOSE_NAME", "CONTROL_BLOCK_NAME", "CQ_STORE_UNIT_SIZE", "FILLER_SIZE", "INDEX_DIR", "LOCK_NAME", "MESSAGE_MAGIC_CODE",
    "MESSAGE_MAGIC_CODE_V2", "NODE_INFO_NAME", "OS_PAGE_SIZE", "STORE_ENTRIES",
]

# -- the store directory (docs/format.md "The store directory") -------------------------------
COMMITLOG_DIR = "commitlog"
CONSUMEQUEUE_DIR = "consumequeue"
INDEX_DIR = "index"
CHECKPOINT_NAME = "checkpoint"
ABORT_NAME = "abort"
LOCK_NAME = "lock"
#: the shared-memory control block (ext/include/mq_ctl.h)
CONTROL_BLOCK_NAME = "mqstore.shm"
#: the owner's configuration, read by service processes and attached stores
CONFIG_NAME = "mqstore.config.json"
#: what `mqstore node` writes about the running node (pids, start time)
NODE_INFO_NAME = "mqstore.node.json"
#: what a clean shutdown leaves for the next open (mqstore.log.clean_close)
CLEAN_CLOSE_NAME = "mqstore.clean.json"
#: every name a store directory may hold (RocketMQ's and mqstore's own)
STORE_ENTRIES = frozenset({COMMITLOG_DIR, CONSUMEQUEUE_DIR, "consumequeue_ext", INDEX_DIR, CHECKPOINT_NAME,
                           ABORT_NAME, LOCK_NAME, "config", CONTROL_BLOCK_NAME, CONFIG_NAME, NODE_INFO_NAME,
                           CLEAN_CLOSE_NAME})

# -- sizes ----------------------------------------------------------------------------------
#: spec §6.1: flush and commit page arithmetic, msync ranges
OS_PAGE_SIZE = 4096
#: spec §3: one ConsumeQueue unit (commitLogOffset 8, size 4, tagsCode 8)
CQ_STORE_UNIT_SIZE = 20
#: spec §3 step 3: a pre-fill or skipped-offset unit is (0, Integer.MAX_VALUE, 0)
FILLER_SIZE = 0x7FFFFFFF

# -- record magic codes (spec §1.1), as Java ints ---------------------------------------------
MESSAGE_MAGIC_CODE = -626843481      # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477   # 0xDAA320AB (5.x)
BLANK_MAGIC_CODE = -875286124        # 0xCBD43194: the END_OF_FILE blank
