"""The package list setuptools installs: every folder under heads/, distill/, eval/, train/ and configs/ that
holds an `__init__.py`, as `draftsmith.<folder>...` (pyproject.toml holds everything else). Computed, so a new
kind folder (heads/<kind>/) ships without an edit outside it; tests/integration/test_wheel.py installs the
wheel and checks."""

from pathlib import Path

from setuptools import setup

FOLDERS = ("heads", "distill", "eval", "train", "configs")
ROOT = Path(__file__).resolve().parent
PACKAGES = sorted("draftsmith." + ".".join(init.parent.relative_to(ROOT).parts)
                  for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")
                  if "__pycache__" not in init.parts)

setup(packages=PACKAGES, package_dir={f"draftsmith.{folder}": folder for folder in FOLDERS})
