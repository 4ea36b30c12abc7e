"""The shipped error-band table (``error_bands.json`` beside this module), read in one place: the bands
(``plan/bands.py``, which writes it) and the measured anchors (``plan/anchors.py``) read it."""

from __future__ import annotations

import json
from importlib import resources

BANDS_FILE = "error_bands.json"  # left out of the sources digest (code_version.DIGEST_EXCLUDES)


def load_bands() -> dict:
    return json.loads(resources.files("echo_tune.plan").joinpath(BANDS_FILE).read_text())
