"""The confidence signals a job reads for each answer, and their display names in tables and figures.

Defined here, below the methods and the report page, so that the report page, the jobs and the gateway name a
signal the same way without importing the method that computes it (``secl.confidence`` computes them).
"""

SIGNALS = ("option_probability", "p_true", "norm_p_true", "verbalized", "dinco")
# Display names of every confidence signal in a table or figure: these, SECL's and the labelled baselines of a
# SECL stream (``evaluation.stream``).
SIGNAL_NAMES = {
    "option_probability": "option probability", "p_true": "P(True)", "norm_p_true": "P(True)Norm",
    "verbalized": "verbalized", "dinco": "DINCO-style", "secl": "SECL", "platt": "Platt (labels, 2-fold)",
    "temperature": "TS (labels, 2-fold)",
    # a SECL stream's comparison pass with the other adapter scope (SECLConfig.adapter_scope)
    "secl_all": "SECL (scope all)", "secl_confidence": "SECL (scope confidence)",
    # the same answers read again with the adapter the stream ended with (``evaluation.stream.final_adapter_pass``)
    "secl_final": "SECL, final adapter",
}
