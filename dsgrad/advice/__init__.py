"""What advises: :func:`dsgrad.recommend` (``recommend``) and the ways to train it races
(``candidates``), run on :func:`dsgrad.fit`'s public surface (:mod:`dsgrad.training.paced`)."""
