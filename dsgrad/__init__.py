"""dsgrad: fast, reliable gradients for doubly-stochastic objectives in JAX.

Gradient estimators are optax transformations; swap one for another in one line::

    opt = optax.chain(dsgrad.joint_saga(objective), optax.adam(1e-2))
    grads = objective.grad(params, indices, noise)
    updates, state = opt.update(grads, state, params, indices=indices, noise=noise)
"""

from dsgrad import annealing
from dsgrad import approx
from dsgrad import checks
from dsgrad import data
from dsgrad import datasets
from dsgrad import families
from dsgrad import mcmc
from dsgrad import mcvae
from dsgrad import models
from dsgrad import noise
from dsgrad import psis
from dsgrad import advice
from dsgrad import training
from dsgrad.training import checkpoint, parallel  # noqa: F401  (dsgrad.training.parallel.*)
from dsgrad.approx import Approximation
from dsgrad.advice.recommend import Recommendation, recommend, recommend_and_fit
from dsgrad.families.gaussian import meanfield_entropy, meanfield_gaussian, meanfield_init
from dsgrad.diagnostics import (estimator_samples, state_bytes, table_bytes, total_variance,
                                 variance_decomposition)
from dsgrad.elbo_estimates import elbo
from dsgrad.logdensity import model_from_logdensity, objective_from_logdensity
from dsgrad.estimators import (AdaptiveWeightState, IncState, JointSagaState, JointSvrgState,
                               SmisoState, cv, inc, joint_saga, joint_svrg, naive, smiso)
from dsgrad.estimators.checked import checked
from dsgrad.estimators.chain import fused_update
from dsgrad.noise import multi_sample
from dsgrad.objective import Objective, gaussian_noise, per_datum
from dsgrad.psis import importance_log_ratios, pareto_k, psis_log_weights
from dsgrad.training.resume import (History, restore_fit_checkpoint, restore_fit_history,
                                    save_fit_checkpoint)
from dsgrad.training.segments import train_step
from dsgrad.training.loop import FitResult, FitTiming, compile_fit, fit
from dsgrad.training.paced import fit_within
from dsgrad.training.progress import Interrupted
from dsgrad.training.cpu_threads import pin_xla_threads

__version__ = "0.1.0"

# What a user calls. Internals (dsgrad.checks, dsgrad.training.segments, ...) are
# importable by name but not part of this list.
__all__ = [
    "Objective", "gaussian_noise", "per_datum", "multi_sample",
    "Approximation",
    "naive", "cv", "inc", "smiso", "joint_saga", "joint_svrg", "checked", "fused_update",
    "IncState", "SmisoState", "JointSagaState", "JointSvrgState", "AdaptiveWeightState",
    "meanfield_gaussian", "meanfield_init", "meanfield_entropy",
    "objective_from_logdensity", "model_from_logdensity",
    "fit", "fit_within", "compile_fit", "train_step", "FitResult", "FitTiming", "Interrupted",
    "History",
    "pin_xla_threads",
    "save_fit_checkpoint", "restore_fit_checkpoint", "restore_fit_history",
    "table_bytes", "state_bytes", "estimator_samples", "total_variance", "elbo",
    "variance_decomposition", "recommend", "recommend_and_fit", "Recommendation",
    "pareto_k", "psis_log_weights", "importance_log_ratios",
    # user-facing namespaces
    "approx", "models", "families", "datasets", "data", "noise", "psis", "mcmc", "mcvae",
    "annealing", "training", "advice",
]
