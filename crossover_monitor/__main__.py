"""Entry point for ``python -m crossover_monitor``."""

import sys

from crossover_monitor.cli.main import main

sys.exit(main())
