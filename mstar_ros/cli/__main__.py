"""``python -m mstar_ros.cli``: the same as the ``mstar-ros`` command."""

import sys

from mstar_ros.cli.main import main

sys.exit(main())
