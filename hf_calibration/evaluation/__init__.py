"""Evaluation protocols that drive the methods from above (nothing below imports this package).

- ``stream``: the SECL stream protocol: the baseline and SECL passes over a labelled multi-domain stream, the
  cross-fitted Platt/temperature-scaling references, ``summarize_stream`` (per domain and overall, with bootstrap
  intervals and the within-domain paired differences) and its table (``hf-calibration secl``).
"""
