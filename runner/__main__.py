"""`python -m runner` is `quorum serve`."""

import sys

from runner.runtime.cli import main

sys.exit(main(["serve", *sys.argv[1:]]))
