"""The worked cases, composed from the kit's parts: ``custom_head/`` (scenario 1, notebook 01),
``cross_validation/`` (scenario 2, notebook 02), ``your_setup`` (notebook 03), and what every notebook
shares: ``notebook`` (the run note, quiet output, a scratch folder) and ``teach`` (the workshop's helpers)."""
__all__: list = []
