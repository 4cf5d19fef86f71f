"""The transformers and TRL versions the trainers are tested with, and the check that enforces them.

``CALMTrainer`` relies on more than the public API of ``transformers.Trainer`` and ``trl.SFTTrainer``:
it overrides private methods (``_save_optimizer_and_scheduler``, ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``, ``_load_best_model``, ``_save``), calls private ones (``_prepare_inputs``, TRL's
``_prepare_dataset``), uses the training loop's contract (``get_batch_samples`` once per optimizer step,
``accelerator.sync_gradients`` at the last micro-batch) and TRL's ``_metrics`` dict, and silences warnings
of TRL 1.16, transformers 5.24 and PEFT 0.21 by their exact text. None of that is covered by semantic
versioning: both projects change private methods and messages in minor releases. So the tested range of
each is the version of ``constraints.txt`` up to, not including, its next minor release (patch releases
are bug fixes and kept in range). A release outside the range raises at construction, naming both
versions; ``HF_CALIBRATION_SKIP_VERSION_CHECK=1`` runs anyway.
"""

from __future__ import annotations

import os
from importlib.metadata import version as installed_version

# package → (lowest tested version, first untested minor release): the versions of constraints.txt
TESTED_VERSIONS = {
    "transformers": ("5.24.0", "5.25"),
    "trl": ("1.16.0", "1.17"),
}
SKIP_VERSION_CHECK_ENV = "HF_CALIBRATION_SKIP_VERSION_CHECK"


def untested_versions(packages=tuple(TESTED_VERSIONS)) -> list[str]:
    """One line per package whose installed version lies outside its tested range, e.g.
    ``"transformers 5.30.0 (tested: >=5.24.0,<5.25)"``; empty when all are in range.

    A pre-release counts as its release (5.25.0.dev0 is 5.25.0, untested). Raises KeyError for a package
    that is not in ``TESTED_VERSIONS``.
    """
    from packaging.version import Version

    out = []
    for name in packages:
        low, high = TESTED_VERSIONS[name]
        found = installed_version(name)
        if not Version(low) <= Version(Version(found).base_version) < Version(high):
            out.append(f"{name} {found} (tested: >={low},<{high})")
    return out


def check_tested_versions(component: str, packages=tuple(TESTED_VERSIONS)) -> None:
    """Raise RuntimeError when ``packages`` are installed in versions ``component`` is not tested with.

    The message names ``component``, each installed and tested version, the pip command that installs tested
    ones and the opt-out: set the environment variable ``HF_CALIBRATION_SKIP_VERSION_CHECK=1`` (also "true",
    "yes") to skip the check.
    """
    if os.environ.get(SKIP_VERSION_CHECK_ENV, "").strip().lower() in ("1", "true", "yes"):
        return
    bad = untested_versions(packages)
    if bad:
        pins = " ".join(f"'{n}>={TESTED_VERSIONS[n][0]},<{TESTED_VERSIONS[n][1]}'" for n in packages)
        raise RuntimeError(
            f"{component} is not tested with {'; '.join(bad)}. It overrides private transformers.Trainer methods "
            f"and relies on TRL internals that change between minor releases, so training could silently "
            f"differ. Install tested versions (pip install {pins}), or set {SKIP_VERSION_CHECK_ENV}=1 to run "
            "anyway at your own risk."
        )
