"""Measurement: benchmarks, the evaluation and its data (RULER, held-out lookups), oracle checks.

Imports the engine, storage and the product service to measure them; nothing in app/ or ui/ imports it."""
