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
    "FENCE_NAME", "LOCAL_MASK", "fence_log_count", "fence_text", "LOG_SHIFT", "MAX_LOGS", "abort_path", "checkpoint_path", "commit_log_k_dir", "config_path",
    "consumequeue_dir", "file_start_of",
    "index_dir", "local_of", "log_base", "log_of", "queue_dir",
]

import os

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
#: the most CommitLogs a store has (docs/parallel-commitlogs.md; ext/include/mq_ctl.h MQ_LOG_MAX)
MAX_LOGS = 32
#: the file a store with several CommitLogs keeps in commitlog/ so that a reader of one CommitLog
#: refuses it: a 20-digit name past 2^63 - 1, which no CommitLog file can have
FENCE_NAME = "99999999999999999999"
_FENCE_TEXT = ("mqstore store with {n} commit logs (commit_log_count={n}); open it with an mqstore that has "
               "commit_log_count\n")
#: every name a store directory may hold (RocketMQ's and mqstore's own; log k >= 1 of a store
#: with several CommitLogs has commitlog-k, index-k and checkpoint-k)
STORE_ENTRIES = frozenset({COMMITLOG_DIR, CONSUMEQUEUE_DIR, "consumequeue_ext", INDEX_DIR, CHECKPOINT_NAME,
                           ABORT_NAME, LOCK_NAME, "config", CONTROL_BLOCK_NAME, CONFIG_NAME, NODE_INFO_NAME,
                           CLEAN_CLOSE_NAME} | {f"{name}-{k}" for name in (COMMITLOG_DIR, INDEX_DIR, CHECKPOINT_NAME)
                                                for k in range(1, MAX_LOGS)})

# -- paths under a store's root (the CommitLog's: StoreConfig.commit_log_dir, which honours
# store_path_commit_log) -----------------------------------------------------------------------


def _of_log(root: str, name: str, log_id: int) -> str:
    """ROOT/<name> for CommitLog 0, ROOT/<name>-<k> for log k of a store with several."""
    return os.path.join(root, name if log_id == 0 else f"{name}-{log_id}")


def commit_log_k_dir(root: str, log_id: int) -> str:
    """The directory of CommitLog log_id >= 1 of a store with several: ROOT/commitlog-<log_id>
    (log 0's is StoreConfig.commit_log_dir, which honours store_path_commit_log)."""
    if not 1 <= log_id < MAX_LOGS:
        raise ValueError(f"CommitLog {log_id}: logs past 0 are 1 .. {MAX_LOGS - 1}")
    return _of_log(root, COMMITLOG_DIR, log_id)


def consumequeue_dir(root: str) -> str:
    return os.path.join(root, CONSUMEQUEUE_DIR)


def queue_dir(root: str, topic: str, queue_id: int) -> str:
    """One ConsumeQueue's directory: ROOT/consumequeue/<topic>/<queueId>."""
    return os.path.join(root, CONSUMEQUEUE_DIR, topic, str(queue_id))


def fence_text(log_count: int) -> str:
    """What the fence file of a store with log_count CommitLogs says (its name is what fences)."""
    return _FENCE_TEXT.format(n=log_count)


def fence_log_count(commit_log_dir: str) -> int | None:
    """The CommitLog count the fence in commit_log_dir names, or None without a fence (a store
    with one CommitLog); 0 for a fence whose text does not name a count."""
    try:
        with open(os.path.join(commit_log_dir, FENCE_NAME), encoding="utf-8", errors="replace") as fh:
            text = fh.read(256)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return 0
    head = "mqstore store with "
    words = text[len(head):].split(" ", 1) if text.startswith(head) else []
    return int(words[0]) if words and words[0].isdigit() and 1 < int(words[0]) <= MAX_LOGS else 0


def index_dir(root: str, log_id: int = 0) -> str:
    """ROOT/index: the IndexFiles of CommitLog 0 (every store's); ROOT/index-<k> those of log k
    of a store with several (docs/parallel-commitlogs.md)."""
    return _of_log(root, INDEX_DIR, log_id)


def checkpoint_path(root: str, log_id: int = 0) -> str:
    """ROOT/checkpoint: CommitLog 0's checkpoint (RocketMQ's file); ROOT/checkpoint-<k> log k's."""
    return _of_log(root, CHECKPOINT_NAME, log_id)


def abort_path(root: str) -> str:
    return os.path.join(root, ABORT_NAME)


def config_path(root: str, *names: str) -> str:
    """ROOT/config/...: the broker's JSON files (topics, groups, offsets) and the Spark writers'."""
    return os.path.join(root, "config", *names)


# -- sizes ----------------------------------------------------------------------------------
#: spec §6.1: flush and commit page arithmetic, msync ranges
OS_PAGE_SIZE = 4096

# -- physical offsets (docs/format.md; ../parallel-commitlogs spec §4.1) ----------------------
#: a physical offset carries the id of its CommitLog in bits 56..62: log k's offsets start at
#: k << LOG_SHIFT, and log 0's (every store with one CommitLog) are RocketMQ's own offsets
LOG_SHIFT = 56
LOCAL_MASK = (1 << LOG_SHIFT) - 1


def log_of(phy: int) -> int:
    """The id of the CommitLog a physical offset is in."""
    return phy >> LOG_SHIFT


def local_of(phy: int) -> int:
    """The offset inside its CommitLog."""
    return phy & LOCAL_MASK


def log_base(log_id: int) -> int:
    """The physical offset of the first byte of CommitLog log_id."""
    return log_id << LOG_SHIFT


def file_start_of(phy: int, file_size: int) -> int:
    """The start offset (and file name) of the file of file_size bytes that holds phy: files of
    log k are log_base(k) + j * file_size. Not ``phy - phy % file_size``, which is wrong past
    log 0 whenever 2^56 is not a multiple of the file size (any multiple of 4 KiB is a size).
    A negative phy (a position before the first byte) is taken as log 0's."""
    if phy < 0:
        return phy - phy % file_size
    local = phy & LOCAL_MASK
    return phy - local % file_size
#: spec §3: one ConsumeQueue unit (commitLogOffset 8, size 4, tagsCode 8)
CQ_STORE_UNIT_SIZE = 20
#: spec §3 step 3: a pre-fill or skipped-offset unit is (0, Integer.MAX_VALUE, 0)
FILLER_SIZE = 0x7FFFFFFF

# -- record magic codes (spec §1.1), as Java ints ---------------------------------------------
MESSAGE_MAGIC_CODE = -626843481      # 0xDAA320A7
MESSAGE_MAGIC_CODE_V2 = -626843477   # 0xDAA320AB (5.x)
BLANK_MAGIC_CODE = -875286124        # 0xCBD43194: the END_OF_FILE blank
