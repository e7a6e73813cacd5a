"""`python -m draftsmith.train ...` (what `accelerate launch -m` runs) is the `draftsmith` CLI."""

import sys

from draftsmith.train.cli import main

sys.exit(main())
