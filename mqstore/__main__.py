"""``python -m mqstore``: the mqstore command (see mqstore.tools.cli)."""

import sys

from mqstore.launch import main

sys.exit(main())
