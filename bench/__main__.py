"""`python -m bench`: the benchmark of chatgate issue 6 (see bench/run.py, or --help)."""

import sys

from bench.run import main

sys.exit(main())
