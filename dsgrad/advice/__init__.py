"""What advises: :func:`dsgrad.recommend` (``recommend``) and its race (``candidates``,
``admission``, ``race``, ``halving``, ``race_elbo``, ``step_sizes``)."""
