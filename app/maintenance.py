"""Checking and repairing a data folder without starting the service (`docqa doctor`, `docqa repair`).

The store does the work (storage.repair); a face reaches it through the service's layer.
"""

from __future__ import annotations

from storage import diagnose, repair

__all__ = ["diagnose", "repair"]
