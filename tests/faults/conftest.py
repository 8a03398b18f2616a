"""The fault suite's fixtures. Each test asserts what a user sees (a clear sentence, no traceback)
and that no stored data is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from faultkit import DOC_A, DOC_B, NEEDLE_Q


@pytest.fixture(scope="module")
def bundled_service_factory():
    """DocQA on the bundled model over a given data folder (the model is small: loads in seconds)."""
    from app.service import DocQA, ServiceConfig

    def make(data_dir: Path, **kw) -> DocQA:
        return DocQA(ServiceConfig(data_dir=data_dir, device="cpu", **kw))
    return make


@pytest.fixture
def library(tmp_path, bundled_service_factory):
    """A data folder with two documents ingested and one answered question; the service is gone."""
    data = tmp_path / "data"
    service = bundled_service_factory(data)
    a, _ = service.ingest(DOC_A, "a.txt")
    b, _ = service.ingest(DOC_B, "b.md")
    assert service.answer(NEEDLE_Q, [a.record.id]).answer == "6150382"
    ids = {"a.txt": a.record.id, "b.md": b.record.id}
    del service
    return data, ids
