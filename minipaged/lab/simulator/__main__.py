"""``python -m minipaged.lab.simulator``: the ``simulate`` command on its own."""

import sys

from minipaged.lab.simulator.cli import main

sys.exit(main())
