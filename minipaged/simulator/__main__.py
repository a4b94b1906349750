"""``python -m minipaged.simulator``: the ``simulate`` command on its own."""

import sys

from minipaged.simulator.cli import main

sys.exit(main())
