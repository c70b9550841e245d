"""Scenario 1, DistilGPT2 with a vocab-by-vocab head: ``scenario`` (the user's model, the prediction, the
advice and the fixes), ``runs`` (measured runs), ``notebook`` (notebook 01's cells) and ``exercises``."""
__all__: list = []
