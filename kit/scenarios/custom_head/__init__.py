"""Scenario 1, DistilGPT2 with a vocab-by-vocab head: ``scenario`` (the user's model, the prediction, the
advice and the fixes), ``runs`` (measured runs), ``notebook`` (notebook 01's cells), ``exercises`` and ``workshop``
(the plan of its instructor notes)."""
__all__: list = []
