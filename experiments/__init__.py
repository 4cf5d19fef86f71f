"""The lab: the papers' tables, seeds pooling, claim checks against the papers' numbers and sensitivity studies.

Run from the repository root as ``python -m experiments NAME [options]`` (``diagnose``, ``secl``, ``calm``;
``--help`` for each). This package is not part of the ``hf-calibration`` wheel (``setup.cfg`` packages only
``hf_calibration``): it changes with every result, and the library does not import it. It calls the library's
jobs and functions and passes their results in memory; what it adds is the experiment drivers, the papers'
thresholds (``secl_claims``, ``calm_claims``) and the result tables.

- ``run``: ``ExperimentConfig`` / ``run_experiment``, the three headline tables and their sub-runs.
- ``calm_config``, ``calm``, ``calm_claims``, ``calm_seeds``, ``calm_open``: the CALM experiment (its options,
  training and scoring, the claim check, the summary over seeds, the open-ended setting).
- ``secl_claims``: the SECL paper's claims checked on a stream's summary.
- ``common``: what several of them share.
"""
