"""Data: vocabularies, synthetic tasks, batching."""
