"""The speculators venv's sanity check (scripts/dev/engine_venv.sh runs it with that venv's python): torch is
still the CPU 2.13.0 build, transformers is 5.19.0, and speculators' EAGLE-3 classes import.

    VENV/bin/python scripts/dev/engine_venv_check.py
"""

from importlib.metadata import version

import speculators  # noqa: F401 (the package itself imports)
import torch
import transformers
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig  # noqa: F401

assert torch.__version__ == "2.13.0+cpu", torch.__version__
assert transformers.__version__ == "5.19.0", transformers.__version__
print("ok: torch", torch.__version__, "transformers", transformers.__version__,
      "speculators", version("speculators"), Eagle3DraftModel.__name__)
