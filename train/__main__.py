"""`python -m draftsmith.train ...` (what `accelerate launch -m` / `torchrun -m` run) is the `draftsmith` CLI.

Multi-process runs on CPU end with `os._exit`: after all work is written, interpreter shutdown of a
gloo process (torch 2.13, with DeepSpeed imported) intermittently aborts with "terminate called
without an active exception" (SIGABRT), which torchrun reports as a failed run. Everything is
flushed first, so nothing is lost by skipping the interpreter's own teardown.
"""

import os
import sys

from draftsmith.train.cli import main

code = main()
if int(os.environ.get("WORLD_SIZE", "1")) > 1:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
sys.exit(code)
