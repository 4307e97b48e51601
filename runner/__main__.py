"""`python -m runner` is `quorum serve`."""

import sys

from runner.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
