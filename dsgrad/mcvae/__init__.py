"""Monte Carlo VAEs (in progress): estimators of a datum's log evidence.

So far: the VAE, IWAE and L-MCVAE (Langevin SIS) bounds and AIS-with-HMC evaluation
(:mod:`dsgrad.mcvae.bounds`), and small MLP encoder/decoder modules with the Bernoulli
image likelihood (:mod:`dsgrad.mcvae.networks`). The convolutional networks, A-MCVAE,
per-datum objectives for the dsgrad estimators and training are not written yet.

References:
  Thin, Kotelevskii, Durmus, Panov, Moulines, Doucet (2021). Monte Carlo variational
  auto-encoders. ICML.
"""

from dsgrad.mcvae.bounds import (LangevinPath, ais_hmc_log_evidence, gaussian_log_prob,
                                 iwae_bound, langevin_kernel_log_density, langevin_sis_bound,
                                 linear_schedule, vae_bound)

from dsgrad.mcvae.networks import (MLPDecoder, MLPEncoder, bernoulli_log_likelihood,
                                   check_images)

__all__ = ["MLPEncoder", "MLPDecoder", "bernoulli_log_likelihood", "check_images","vae_bound", "iwae_bound", "langevin_sis_bound", "LangevinPath",
           "langevin_kernel_log_density", "ais_hmc_log_evidence", "gaussian_log_prob",
           "linear_schedule"]
