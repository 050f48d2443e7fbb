"""Thin front-ends: decode, call the InferenceService, encode; one error mapper each."""
