"""Annealed variational inference: DAIS, NS-DAIS and SL-DAIS with surrogate likelihoods.

* :mod:`dsgrad.annealing.dais` -- the log weight of one differentiable AIS chain
  (uncorrected underdamped HMC along an annealing path, Lemma 1) and its learnable
  settings (step size bounded by ``eta_max``, refreshment, temperatures, mass);
* :mod:`dsgrad.annealing.surrogates` -- surrogate log likelihoods as Flax NNX modules:
  RAND (:func:`rand_surrogate`), CS-INIT / CS-FIX (:func:`coreset_surrogate`) and NN
  (:class:`NeuralSurrogate`);
* :mod:`dsgrad.annealing.objective` -- :class:`AnnealedVI`: DAIS (full-data dynamics),
  NS-DAIS (mini-batch dynamics) and SL-DAIS (surrogate dynamics) as doubly-stochastic
  :class:`dsgrad.Objective` s, usable with every estimator.

References:
  Jankowiak, Phan (2022). Surrogate likelihoods for variational annealed importance
  sampling. ICML.
"""

from dsgrad.annealing.dais import (ChainSettings, DaisPath, chain_settings, dais_log_weight,
                                   init_chain_params)
from dsgrad.annealing.objective import AnnealedVI
from dsgrad.annealing.surrogates import (NeuralSurrogate, Surrogate, SurrogateLikelihood,
                                         WeightedDataSurrogate, coreset_surrogate,
                                         rand_surrogate)

__all__ = ["AnnealedVI", "SurrogateLikelihood", "WeightedDataSurrogate", "NeuralSurrogate",
           "Surrogate", "rand_surrogate", "coreset_surrogate", "dais_log_weight", "DaisPath",
           "ChainSettings", "chain_settings", "init_chain_params"]
