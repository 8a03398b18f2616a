"""The choices the service's faces offer (the web page's settings, the CLI's options).

Each vocabulary is defined once, where it is implemented (the engine's KV modes, decoders, scorers
and position modes; the store's KV encodings); the faces read them here, so that they talk to the
service and never reach below it.
"""

from __future__ import annotations

from engine import CACHED_KV_MODES, DECODERS, KV_MODES
from engine.method.kv_cache import POSITION_MODES
from engine.method.scoring import SCORERS
from storage.kv_codec import DEFAULT_KV_ENCODING, KV_ENCODINGS

__all__ = ["CACHED_KV_MODES", "DECODERS", "DEFAULT_KV_ENCODING", "KV_ENCODINGS", "KV_MODES", "POSITION_MODES",
           "SCORERS"]
