"""What trains: :func:`dsgrad.fit`'s loop and what it is built from.

``loop`` (``fit``), ``segments`` (many steps in one compiled program, ``train_step``),
``batching`` (the one sampler of indices), ``evaluation_plan`` (when the ELBO is
evaluated), ``resume`` and ``checkpoint`` (saves and their checks), ``host_data``
(memory-mapped rows read ahead), ``parallel`` (several devices), ``paced`` (a run paced to
a budget of seconds: :func:`dsgrad.fit_within`), ``compile_cache`` and ``progress``. Users
call :func:`dsgrad.fit`, :func:`dsgrad.fit_within` and the checkpoint functions re-exported
from :mod:`dsgrad`; the modules are imported by name where needed (nothing here is
imported eagerly, so that :mod:`dsgrad.data` can use ``host_data`` without importing
the loop).
"""
