"""``python -m mqstore``: the mqstore command (see mqstore.cli)."""

import sys

from mqstore.launch import main

sys.exit(main())
