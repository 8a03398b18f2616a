"""Diffusion decoding: the block loop, sampling rules, and decoding over static cached KV (the
reference path and the paged GPU fast path)."""
