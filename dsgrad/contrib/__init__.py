"""Bridges to other libraries, each behind an optional extra (``dsgrad.contrib.numpyro``
needs ``pip install 'dsgrad[numpyro]'``). Import the submodule you need."""
