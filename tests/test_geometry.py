"""A store reopened without its file sizes reuses the ones it was created with; a size that
differs is a ConfigError naming both; store_path_root_dir is honoured only when it names the
directory opened (issue 14)."""

from __future__ import annotations

import json
import os

import pytest

from mqstore import ConfigError, Message, MessageStore, StoreConfig
from mqstore.tools.checker import check_store
from mqstore.geometry import adopt_store_sizes, sizes_on_disk
from mqstore.layout import CONFIG_NAME

SIZES = {"mapped_file_size_commit_log": 64 * 1024, "mapped_file_size_consume_queue": 20 * 50,
         "max_hash_slot_num": 64, "max_index_num": 256}


def fill(root: str, n: int = 300, **config) -> None:
    with MessageStore(root, **{**SIZES, "max_message_size": 4096, **config}) as store:
        for i in range(n):
            store.put_message(Message("T", b"m%04d" % i + b"." * 400, queue_id=i % 2, keys=[f"k{i}"])).check()
        assert store.wait_dispatched()


def test_a_store_reopened_without_its_sizes_reuses_them(tmp_path):
    root = str(tmp_path / "s")
    fill(root)
    assert len(os.listdir(os.path.join(root, "commitlog"))) > 1
    with MessageStore(root, max_message_size=4096) as store:  # no sizes given
        for key, value in SIZES.items():
            assert getattr(store.config, key) == value
        assert store.recovery.redispatched_records == 0
        assert store.get_max_offset_in_queue("T", 0) == 150
        assert [bytes(m.body)[:5] for m in store.query_message("T", "k7").messages] == [b"m0007"]
        store.put_message(Message("T", b"more", queue_id=0)).check()
    check_store(root).raise_if_failed()


@pytest.mark.parametrize("key", list(SIZES))
def test_a_size_other_than_the_stores_is_a_config_error_naming_both(tmp_path, key):
    root = str(tmp_path / "s")
    fill(root, 20)
    other = {**SIZES, key: SIZES[key] * 2}
    with pytest.raises(ConfigError, match=f"{key}={SIZES[key] * 2}, but the store was created with "
                                          f"{key}={SIZES[key]}"):
        MessageStore(root, **other)
    assert not os.path.exists(os.path.join(root, "abort"))
    check_store(root).raise_if_failed()


def test_a_directory_without_the_config_file_gives_its_sizes_from_the_files(tmp_path):
    """A store RocketMQ wrote has no mqstore.config.json: the CommitLog and ConsumeQueue
    sizes are read off the files (the distance between two file names)."""
    root = str(tmp_path / "s")
    fill(root)
    os.unlink(os.path.join(root, CONFIG_NAME))
    cfg = StoreConfig(max_hash_slot_num=64, max_index_num=256)
    assert sizes_on_disk(root, cfg) == {"mapped_file_size_commit_log": SIZES["mapped_file_size_commit_log"],
                                        "mapped_file_size_consume_queue": SIZES["mapped_file_size_consume_queue"],
                                        "commit_log_count": 1}  # CommitLog files without the fence: one log
    adopted = adopt_store_sizes(root, cfg)
    assert adopted.mapped_file_size_commit_log == SIZES["mapped_file_size_commit_log"]
    with MessageStore(root, cfg, max_message_size=4096) as store:
        assert store.get_max_offset_in_queue("T", 1) == 150


def test_a_new_store_takes_the_sizes_given(tmp_path):
    root = str(tmp_path / "s")
    with MessageStore(root, mapped_file_size_commit_log=1 << 20) as store:
        assert store.config.mapped_file_size_commit_log == 1 << 20
    with open(os.path.join(root, CONFIG_NAME)) as fh:
        assert json.load(fh)["mapped_file_size_commit_log"] == 1 << 20


def test_store_path_root_dir_must_name_the_directory_opened(tmp_path):
    root = tmp_path / "s"
    with pytest.raises(ConfigError, match=r"store_path_root_dir='/elsewhere/store' but the store is opened on"):
        MessageStore(root, store_path_root_dir="/elsewhere/store")
    assert not root.exists()
    conf = tmp_path / "broker.conf"
    conf.write_text(f"storePathRootDir={root}\nmappedFileSizeCommitLog=65536\n")
    with MessageStore(root, StoreConfig.from_broker_conf(conf)) as store:  # the same directory: honoured
        assert store.config.store_path_root_dir == str(root)


def test_a_size_given_explicitly_is_checked_even_when_it_is_the_default(tmp_path):
    root = str(tmp_path / "s")
    fill(root, 5)
    with pytest.raises(ConfigError, match="mapped_file_size_consume_queue=6000000, but the store was created with"):
        MessageStore(root, mapped_file_size_consume_queue=6_000_000)  # the default, but chosen


def test_explicit_keys_are_the_keys_somebody_chose():
    import pickle

    cfg = StoreConfig(flush_disk_type="ASYNC_FLUSH")  # the default value, chosen
    assert cfg.explicit_keys == {"flush_disk_type"}
    cfg.file_reserved_time = 1
    assert cfg.replace(max_message_size=10).explicit_keys == {"flush_disk_type", "file_reserved_time",
                                                               "max_message_size"}
    assert pickle.loads(pickle.dumps(cfg)).explicit_keys == cfg.explicit_keys
    assert StoreConfig.from_broker_conf("deleteWhen=04\nbrokerIP2=10.0.0.1\n").explicit_keys == {"delete_when"}
    assert StoreConfig() == cfg.replace(flush_disk_type="ASYNC_FLUSH", file_reserved_time=72)  # values only
