"""The method along a question's path: chunking, prefill, the prompt layout, drafting and scoring,
selection, placement of the cached KV, and the answer that ties them together."""
