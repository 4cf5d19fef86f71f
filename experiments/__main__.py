"""``python -m experiments NAME [options]`` (``experiments.cli``)."""

import sys

from experiments.cli import main

sys.exit(main())
