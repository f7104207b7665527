"""Monte Carlo VAEs: VAE, IWAE, L-MCVAE and A-MCVAE, trained with any dsgrad estimator.

* :mod:`dsgrad.mcvae.bounds` -- estimators of one datum's log evidence: the VAE, IWAE,
  L-MCVAE (Langevin SIS, Alg. 1) and A-MCVAE (MALA AIS, Alg. 2, with its REINFORCE
  surrogate) bounds, and AIS with HMC for evaluation;
* :mod:`dsgrad.mcvae.networks` -- encoder/decoder NNX modules (MLP and convolutional)
  and the Bernoulli/Gaussian image likelihoods;
* :mod:`dsgrad.mcvae.model` -- :class:`MonteCarloVAE`: a bound as a per-datum
  doubly-stochastic :class:`dsgrad.Objective` (so ``cv``, ``joint_svrg``, ... apply and
  :func:`dsgrad.fit` trains it), generation, and the held-out AIS negative log-likelihood.

References:
  Thin, Kotelevskii, Durmus, Panov, Moulines, Doucet (2021). Monte Carlo variational
  auto-encoders. ICML.
"""

from dsgrad.mcvae.bounds import (LangevinPath, MalaPath, ais_hmc_log_evidence,
                                 amcvae_surrogate, gaussian_log_prob, iwae_bound,
                                 langevin_kernel_log_density, langevin_sis_bound,
                                 linear_schedule, mala_ais_bound, schedule_from_logits,
                                 vae_bound)

from dsgrad.mcvae.model import METHODS, MonteCarloVAE
from dsgrad.mcvae.networks import (ConvDecoder, ConvEncoder, MLPDecoder, MLPEncoder,
                                   bernoulli_log_likelihood, check_images,
                                   gaussian_log_likelihood)

__all__ = ["MonteCarloVAE", "METHODS", "ConvEncoder", "ConvDecoder",
           "gaussian_log_likelihood", "MLPEncoder", "MLPDecoder", "bernoulli_log_likelihood",
           "check_images", "vae_bound", "iwae_bound", "langevin_sis_bound", "LangevinPath",
           "langevin_kernel_log_density", "ais_hmc_log_evidence", "gaussian_log_prob",
           "linear_schedule", "schedule_from_logits", "mala_ais_bound", "MalaPath",
           "amcvae_surrogate"]
