"""What `python -m kit fit` answers first: the lines up to the one that closes the answer (the largest batch, or that
none fits, the list of other changes, or the pointer to the details), a wrapped line counted with its own."""

ANSWER_ENDS = ("largest batch", "no batch fits", "details:", "the next closest", "other changes", "no change needed")


def fit_answer(out: str) -> tuple:
    """(every line fit printed, less a wrapped line's indented continuation; the answer's lines)."""
    said = [line for line in out.strip().splitlines() if not line.startswith(" ")]
    return said, said[:next(i for i, line in enumerate(said) if line.startswith(ANSWER_ENDS)) + 1]
