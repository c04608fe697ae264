"""Pieces the recall tasks share: the small language model and its training loop."""
