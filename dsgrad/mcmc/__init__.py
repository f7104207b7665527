"""Subsampling MCMC: HMC with energy-conserving subsampling, and SGLD / SG-HMC baselines.

    result = dsgrad.mcmc.sample(key, model, num_samples=2000, subsample_size=1000)
    result.samples                      # (2000, d) draws
    dsgrad.mcmc.effective_sample_size(result.samples)

Lower level (BlackJAX style, pure and jit-able): :func:`taylor_proxy` (control variates
around ``theta*``), a subsample scheme (:func:`perturbed`, :func:`block_poisson`),
:func:`hmc_parameters`, then :func:`hmcecs` / :func:`build_kernel`, or :func:`sgld` and
:func:`sghmc`.

References:
  Dang, Quiroz, Kohn, Tran, Villani (2019). Hamiltonian Monte Carlo with energy
  conserving subsampling. JMLR 20.
"""

from dsgrad.mcmc.diagnostics import (computational_time, effective_sample_size,
                                     inefficiency_factor, positive_fraction, signed_mean)
from dsgrad.mcmc import hmc
from dsgrad.mcmc.hmcecs import (HMCECSInfo, HMCECSState, HMCParameters, SamplingAlgorithm,
                                build_kernel, hmc_parameters, hmcecs, init, reset)
from dsgrad.mcmc.proxy import (TaylorProxy, difference_estimator, differences,
                               gradient_estimate, log_likelihood_estimate, proxy_sum,
                               proxy_values, taylor_proxy)
from dsgrad.mcmc.dual_averaging import (DualAveraging, dual_averaging_init,
                                        dual_averaging_update)
from dsgrad.mcmc.reference import (find_reference_point, laplace_draws, laplace_precision,
                                   refine_reference_point)
from dsgrad.mcmc.sample import MCMCResult, sample
from dsgrad.mcmc.chain import Diverged, run_chain
from dsgrad.mcmc import estimator_noise
from dsgrad.mcmc.estimator_noise import choose_subsample_size
from dsgrad.mcmc.proxy import EstimatorVariance
from dsgrad.mcmc.sgmcmc import (SGInfo, SGState, log_posterior_gradient, sghmc, sghmc_kernel,
                                 sgld, sgld_kernel)
from dsgrad.mcmc.subsample import (PoissonSubsample, SubsampleScheme, block_poisson, full_data,
                                   perturbed, suggest_block_poisson)

__all__ = [
    "sample", "MCMCResult", "run_chain", "Diverged",
    "estimator_noise", "choose_subsample_size", "EstimatorVariance",
    "hmc", "hmcecs", "build_kernel", "init", "reset", "hmc_parameters", "HMCParameters",
    "HMCECSState", "HMCECSInfo", "SamplingAlgorithm",
    "TaylorProxy", "taylor_proxy", "proxy_sum", "proxy_values", "differences",
    "difference_estimator", "log_likelihood_estimate", "gradient_estimate",
    "SubsampleScheme", "perturbed", "block_poisson", "full_data", "PoissonSubsample",
    "suggest_block_poisson",
    "sgld", "sghmc", "sgld_kernel", "sghmc_kernel", "SGState", "SGInfo", "log_posterior_gradient",
    "find_reference_point", "refine_reference_point", "laplace_precision", "laplace_draws",
    "DualAveraging", "dual_averaging_init", "dual_averaging_update",
    "effective_sample_size", "inefficiency_factor", "computational_time",
    "positive_fraction", "signed_mean",
]
