"""Plumbing every layer may use: atomic output folders (``outputs``), process-group helpers
(``distributed``), offline-asset detection (``offline``) and the tested-version checks (``versions``)."""
