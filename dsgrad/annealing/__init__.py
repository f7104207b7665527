"""Annealed variational inference (in progress): DAIS and SL-DAIS.

* :mod:`dsgrad.annealing.dais` -- the log weight of one differentiable AIS chain
  (uncorrected underdamped HMC along an annealing path, Lemma 1) and its learnable
  settings (step size bounded by ``eta_max``, refreshment, temperatures, mass);
* :mod:`dsgrad.annealing.objective` -- :class:`AnnealedVI`: DAIS (full-data dynamics) and
  SL-DAIS (dynamics guided by a surrogate log likelihood, :func:`rand_surrogate`) as
  doubly-stochastic :class:`dsgrad.Objective` s.

Not yet here: NS-DAIS, the coreset and neural-network surrogates, surrogates as NNX
modules, and the ``dsgrad.bench dais`` comparison with NumPyro.

References:
  Jankowiak, Phan (2022). Surrogate likelihoods for variational annealed importance
  sampling. ICML.
"""

from dsgrad.annealing.dais import (ChainSettings, DaisPath, chain_settings, dais_log_weight,
                                   init_chain_params)
from dsgrad.annealing.objective import AnnealedVI, Surrogate, rand_surrogate

__all__ = ["AnnealedVI", "Surrogate", "rand_surrogate", "dais_log_weight", "DaisPath",
           "ChainSettings", "chain_settings", "init_chain_params"]
