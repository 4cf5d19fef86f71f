"""What a run shows: metrics tables and output files (``reports``), reliability diagrams (``plotting``)
and the self-contained report page (``html_report``)."""
