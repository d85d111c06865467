"""From figures to what a person reads: the choices in people's terms (``choices``: hardware, model,
controls, and their resolution into the estimator's inputs), the verdict's words (``verdict``), a
live run held against its estimate (``run_vs_estimate``) and the settings remembered between
launches (``prefs``)."""
