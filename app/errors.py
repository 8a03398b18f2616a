"""The errors a face of the service reports to its user, each as one clear line.

They are raised where the fault is found (loading the model, the store, an ingest, a question);
the faces catch them from here.
"""

from __future__ import annotations

from app.ingest import IngestError
from app.service import QuestionStopped, ServiceBusy
from engine.model.config import ConfigError
from engine.model.tokenizer import TokenizerError
from engine.model.weights import CheckpointError
from storage import StorageError

# A model folder that cannot be loaded: a missing or damaged file, a config or tokenizer it cannot read.
MODEL_ERRORS: tuple[type[Exception], ...] = (CheckpointError, ConfigError, TokenizerError)

__all__ = ["MODEL_ERRORS", "IngestError", "QuestionStopped", "ServiceBusy", "StorageError", "without_name"]


def without_name(message: str, name: str) -> str:
    """Pure: an error message that opens with the file's name, for a line the name already heads:
    "a.pdf is a binary file" -> "it is a binary file"."""
    return "it" + message[len(name):] if message.startswith(name + " ") else message
