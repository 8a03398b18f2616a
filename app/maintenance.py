"""Checking and repairing a data folder without starting the service (`docqa doctor`, `docqa repair`).

The store does the work (storage.repair); a face reaches it through the service's layer, which adds
what only the service knows of: its temporary folder of uploads.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from app.service import UPLOAD_TEMP, upload_debris
from storage import RepairReport
from storage import diagnose as diagnose_store
from storage import repair as repair_store


def diagnose(root: str | Path) -> RepairReport:
    """What `repair` would find, changing nothing."""
    report = diagnose_store(root)
    debris = upload_debris(Path(root).expanduser() / UPLOAD_TEMP)
    if debris:
        report.problems.append(f"{len(debris)} empty temporary upload file(s) left in {UPLOAD_TEMP}/")
    return report


def repair(root: str | Path) -> RepairReport:
    """Puts the data folder right (storage.repair), its temporary folder's debris removed too."""
    report = repair_store(root)
    debris = upload_debris(Path(root).expanduser() / UPLOAD_TEMP)
    for path in debris:
        with contextlib.suppress(OSError):  # a read-only folder: reported, left as it is
            path.unlink(missing_ok=True)
    if debris:
        report.problems.append(f"{len(debris)} empty temporary upload file(s) were left in {UPLOAD_TEMP}/")
        report.actions.append(f"removed them from {UPLOAD_TEMP}/")
    return report


__all__ = ["diagnose", "repair"]
