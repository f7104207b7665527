"""Ground truth for the ELBO dsgrad reports (`dsgrad.elbo`, the ELBO column of `fit`):
the estimate agrees with Gauss-Hermite quadrature of the exact ELBO, and its standard
error is the spread that repeated estimates really have."""

import jax
import numpy as np
import pytest

import dsgrad
from conftest import exact_negative_elbo


@pytest.mark.parametrize("shared_noise", [True, False])
def test_elbo_and_its_standard_error_match_quadrature(logreg_model, logreg_data, params0,
                                                       shared_noise):
  objective = dsgrad.meanfield_gaussian(logreg_model, shared_noise=shared_noise)
  exact = -float(exact_negative_elbo(logreg_data)(params0))
  # chunk_size below N: one Monte Carlo sample spans several chunks.
  estimates = [dsgrad.elbo(objective, params0, key, 400, chunk_size=16)
               for key in jax.random.split(jax.random.key(11), 30)]
  means = np.array([m for m, _ in estimates])
  ses = np.array([s for _, s in estimates])
  # Each estimate is within 4.5 of its own standard errors of the truth ...
  assert np.all(np.abs(means - exact) < 4.5 * ses), (means - exact, ses)
  # ... their average within 4 standard errors of the average ...
  assert abs(means.mean() - exact) < 4 * ses.mean() / np.sqrt(len(means))
  # ... and the reported standard error is the spread of repeated estimates: the ratio of
  # their sample SD (29 degrees of freedom) to the mean reported SE lies in the chi-square
  # interval [0.6, 1.4] (probability outside it below 1e-3).
  ratio = means.std(ddof=1) / ses.mean()
  assert 0.6 < ratio < 1.4, ratio
