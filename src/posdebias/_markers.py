"""The pluggy project name and the public ``hookimpl`` marker.

They live at the bottom of the package so that every built-in adapter, calibrator and bundled
model module can mark its own hook implementations without importing the registry above it.
"""

from __future__ import annotations

import pluggy

PROJECT_NAME = "posdebias"

#: Marks a plugin's hook implementations (public as ``posdebias.hookimpl``).
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)
