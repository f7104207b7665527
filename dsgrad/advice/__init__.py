"""What advises: :func:`dsgrad.recommend` (``recommend``), the ways to train it races
(``candidates``) and their runs on :func:`dsgrad.fit`'s public surface (``runs``)."""
