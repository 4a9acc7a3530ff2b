"""The owner's configuration file (``mqstore.config.json``), written when a store opens and read
by the node's service processes and by every process that attaches."""

from __future__ import annotations

import json
import os

from mqstore.config import NOT_SAVED_KEYS, SECRET_KEYS, StoreConfig
from mqstore.layout import CONFIG_NAME
from mqstore.log.directory import replace_file


def write_config(root: str, config: StoreConfig) -> None:
    """Write config where service processes and attaching processes read it (atomically).
    Nothing is written when the file already says the same (a store reopened on a full disk
    with its own settings needs no new block for it)."""
    path = os.path.join(root, CONFIG_NAME)
    values = {k: v for k, v in config.to_dict(changed_only=True).items() if k not in NOT_SAVED_KEYS}
    if "ha_listen_port" in config.explicit_keys:  # given, even at its default: the master serves slaves
        values["ha_listen_port"] = config.ha_listen_port
    text = json.dumps(values, indent=1, sort_keys=True)
    try:
        with open(path, encoding="utf-8") as fh:
            if fh.read() == text:
                if SECRET_KEYS & values.keys():
                    os.chmod(path, 0o600)
                return
    except (OSError, UnicodeDecodeError):
        pass
    # a secret (inner_secret_key, ...) in it: readable by the store's owner only
    replace_file(path, text, fsync=True, mode=0o600 if SECRET_KEYS & values.keys() else 0o666)


def read_config(root: str) -> StoreConfig:
    """The configuration the owner of root wrote (StoreConfig defaults where it changed nothing)."""
    with open(os.path.join(root, CONFIG_NAME), encoding="utf-8") as fh:
        return StoreConfig.from_dict(json.load(fh)).validate()
