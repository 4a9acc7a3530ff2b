"""python -m mqstore.config: print docs/config.md; --typed-keys: mqstore/_config_keys.py."""

import sys

from mqstore.config.docs import render_config_doc, render_typed_keys

print(render_typed_keys() if sys.argv[1:] == ["--typed-keys"] else render_config_doc(), end="")
