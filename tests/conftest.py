"""Shared fixtures: tiny random checkpoints in the real Dream and LLaDA on-disk formats."""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    # Without a GPU the Triton kernels run under Triton's interpreter (set before any kernel is
    # defined), so their indexing, masking and merging are tested on every machine.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from engine.model.random_checkpoint import write_random_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def dream_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dream-tiny")
    write_random_checkpoint(folder, "dream", seed=1)
    return folder


@pytest.fixture(scope="session")
def llada_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llada-tiny")
    write_random_checkpoint(folder, "llada", seed=2)
    return folder


@pytest.fixture(scope="session")
def engines(dream_dir, llada_dir):
    """Both tiny checkpoints loaded on the CPU, by family."""
    from engine import Engine

    return {"dream": Engine.from_pretrained(dream_dir, device="cpu"),
            "llada": Engine.from_pretrained(llada_dir, device="cpu")}


@pytest.fixture(params=["dream", "llada"])
def family_dir(request, dream_dir, llada_dir):
    return request.param, (dream_dir if request.param == "dream" else llada_dir)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
