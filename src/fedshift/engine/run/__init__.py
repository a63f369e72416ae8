"""One run: the round loop (``runner``), its run directory (``rundir``), the scores of each
round (``evaluation``), model selection (``selection``) and experiment loggers (``tracking``)."""
