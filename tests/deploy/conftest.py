"""pytest setup for the deployment tests: the helpers in this directory import
as plain modules, and the binaries default to the prebuilt ones in CI images
that have them."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
