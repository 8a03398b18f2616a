"""Offline stand-in for the part of nltk the RULER generators use (no punkt download)."""
