"""The file sizes a store was created with, reused when it is opened again.

A store's CommitLog, ConsumeQueue and index files all have the sizes it was created with
(``mapped_file_size_commit_log``, ``mapped_file_size_consume_queue``, ``max_hash_slot_num`` and
``max_index_num``); opening it with other sizes cannot work. RocketMQ makes the operator repeat
them in every broker.conf. Here a size left at its default is taken from the store: from
``mqstore.config.json`` (what its last owner ran with), or, for a directory RocketMQ wrote,
from the files on disk; a size set to something else is refused with a ConfigError naming both.

"Left at its default" means not set at all (StoreConfig.explicit_keys): a size given
explicitly, even the default value, must match the store's.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mqstore.layout import CONFIG_NAME, FENCE_NAME, consumequeue_dir, fence_log_count
from mqstore.config import DEFINITIONS, StoreConfig
from mqstore.errors import ConfigError

#: the name mqstore.node writes the owner's configuration under (kept in sync by a test)
GEOMETRY_KEYS = ("mapped_file_size_commit_log", "mapped_file_size_consume_queue", "max_hash_slot_num",
                 "max_index_num", "commit_log_count")
_CQ_UNIT = 20


def _names(directory: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(directory) if len(n) == 20 and n.isdigit() and n != FENCE_NAME)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _size_from_files(directory: str) -> int | None:
    """The file size of a directory of files named by their start offset: the distance between
    the first two names, or the size of a single file (None without files)."""
    starts = _names(directory)
    if len(starts) >= 2:
        return starts[1] - starts[0]
    if starts:
        size = os.path.getsize(os.path.join(directory, f"{starts[0]:020d}"))
        return size or None
    return None


def sizes_on_disk(root: str, config: StoreConfig) -> dict[str, int]:
    """The CommitLog and ConsumeQueue file sizes the files under root show (keys of
    GEOMETRY_KEYS; index sizes cannot be told from an index file and are not included)."""
    found: dict[str, int] = {}
    count = fence_log_count(config.commit_log_dir(root))
    dirs = config.replace(commit_log_count=count).commit_log_dirs(root) if count else [config.commit_log_dir(root)]
    commitlog = next((size for d in dirs if (size := _size_from_files(d)) is not None), None)
    if count:  # a store with several CommitLogs whose mqstore.config.json is gone
        found["commit_log_count"] = count
    elif count is None and commitlog is not None:  # CommitLog files and no fence: a store with one
        found["commit_log_count"] = 1
    if commitlog is not None:
        found["mapped_file_size_commit_log"] = commitlog
    cq_root = consumequeue_dir(root)
    single: int | None = None
    try:
        topics = sorted(os.listdir(cq_root))
    except (FileNotFoundError, NotADirectoryError):
        topics = []
    for topic in topics:
        try:
            queues = sorted(os.listdir(os.path.join(cq_root, topic)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for queue in queues:
            directory = os.path.join(cq_root, topic, queue)
            starts = _names(directory)
            if len(starts) >= 2:  # decisive: a queue that rolled
                found["mapped_file_size_consume_queue"] = starts[1] - starts[0]
                return found
            if starts and single is None:
                size = os.path.getsize(os.path.join(directory, f"{starts[0]:020d}"))
                single = size if size and size % _CQ_UNIT == 0 else None
    if single is not None:
        found["mapped_file_size_consume_queue"] = single
    return found


def _saved_config(root: str) -> dict[str, Any] | None:
    """root's mqstore.config.json as its owner wrote it, or None when there is no readable one."""
    try:
        with open(os.path.join(root, CONFIG_NAME), encoding="utf-8") as fh:
            saved: Any = json.load(fh)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def saved_sizes(root: str) -> dict[str, int] | None:
    """The sizes in root's mqstore.config.json (a size its owner left at the default is the
    default), or None when there is no readable one."""
    saved = _saved_config(root)
    if saved is None:
        return None
    out = {}
    for key in GEOMETRY_KEYS:
        value = saved.get(key, DEFINITIONS[key].default)
        out[key] = DEFINITIONS[key].coerce(value)
    return out


def store_sizes(root: str, config: StoreConfig) -> tuple[dict[str, int], str]:
    """The sizes root was created with and where they were read: mqstore.config.json, then
    the files (for a store RocketMQ wrote). Empty for a new store."""
    saved = saved_sizes(root)
    if saved is not None:
        return saved, os.path.join(root, CONFIG_NAME)
    return sizes_on_disk(root, config), "the files on disk"


def adopt_store_sizes(root: str, config: StoreConfig) -> StoreConfig:
    """config with root's own file sizes where it does not set them.

    ConfigError when config sets a size other than the store's (the message names both and
    where the store's was read)."""
    sizes, source = store_sizes(root, config)
    changes: dict[str, int] = {}
    clashes = []
    for key, size in sizes.items():
        asked = getattr(config, key)
        if asked == size:
            continue
        if key not in config.explicit_keys:
            changes[key] = size
        else:
            clashes.append(f"{key}={asked}, but the store was created with {key}={size} ({source})")
    if clashes:
        raise ConfigError(f"{root}: " + "; ".join(clashes),
                          hint="leave the file sizes and commit_log_count out when reopening a store: it "
                               "reuses its own")
    return config.replace(**changes) if changes else config


def saved_commit_log_path(root: str) -> str | None:
    """store_path_commit_log as root's mqstore.config.json has it ("" when its owner left the
    default, ROOT/commitlog), or None without a readable one."""
    saved = _saved_config(root)
    if saved is None:
        return None
    value = saved.get("store_path_commit_log", DEFINITIONS["store_path_commit_log"].default)
    return value if isinstance(value, str) else None


def adopt_commit_log_path(root: str, config: StoreConfig) -> StoreConfig:
    """config with the CommitLog directory root's last owner used, when config does not set
    one: a store created with store_path_commit_log reopened without it would otherwise find
    ROOT/commitlog empty and, as RocketMQ does with an empty CommitLog, destroy its
    ConsumeQueues. ConfigError when config sets another directory than the saved one while
    the saved one still holds CommitLog files (move the files first, then name where)."""
    config = _adopt_commit_log_paths(root, config)
    saved = saved_commit_log_path(root)
    if saved is None:
        return config
    saved_dir = config.replace(store_path_commit_log=saved).commit_log_dir(root)
    wanted_dir = config.commit_log_dir(root)
    if os.path.realpath(saved_dir) == os.path.realpath(wanted_dir):
        return config
    if "store_path_commit_log" not in config.explicit_keys:
        return config.replace(store_path_commit_log=saved)
    if _names(saved_dir):
        raise ConfigError(f"{root}: store_path_commit_log={config.store_path_commit_log!r} ({wanted_dir}), but the "
                          f"store's CommitLog is in {saved_dir} ({os.path.join(root, CONFIG_NAME)})",
                          hint="leave store_path_commit_log out to use the store's own, or move its CommitLog "
                               "files to the new directory first")
    return config


def _adopt_commit_log_paths(root: str, config: StoreConfig) -> StoreConfig:
    """store_path_commit_logs as root's last owner had it, when config does not set it; a set
    one naming other directories than the saved ones while those hold CommitLog files is
    refused, as store_path_commit_log is."""
    saved = (_saved_config(root) or {}).get("store_path_commit_logs")
    if not isinstance(saved, str) or saved == config.store_path_commit_logs:
        return config
    if "store_path_commit_logs" not in config.explicit_keys:
        return config.replace(store_path_commit_logs=saved)
    wanted = config.commit_log_dirs(root)
    held = [d for d in config.replace(store_path_commit_logs=saved).commit_log_dirs(root)
            if d not in wanted and _names(d)]
    if held:
        raise ConfigError(f"{root}: store_path_commit_logs={config.store_path_commit_logs!r}, but the store's "
                          f"CommitLog files are in {', '.join(held)} ({os.path.join(root, CONFIG_NAME)})",
                          hint="leave store_path_commit_logs out to use the store's own, or move the files first")
    return config


def check_root_dir(root: str, config: StoreConfig) -> None:
    """ConfigError when store_path_root_dir names another directory than root, the one the
    store is opened on (a broker.conf's storePathRootDir is honoured only when they agree)."""
    configured = config.store_path_root_dir
    if not configured:
        return
    wanted = os.path.realpath(os.path.expanduser(configured))
    if wanted != os.path.realpath(root):
        raise ConfigError(f"store_path_root_dir={configured!r} but the store is opened on {root}",
                          hint="open the directory store_path_root_dir names, or remove storePathRootDir "
                               "from the configuration")
