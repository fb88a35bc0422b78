"""The collective engine of several ranks: every step one exchange among all ranks.

``engine.py`` (:class:`~.engine.CollectiveEngine`) is the engine as the table sees it;
``stepper.py`` (:class:`~.stepper.Stepper`) runs a step's stages (the write rule, the sizes
exchange) and hands the exchange to a transport: ``exact.py`` (payloads sized exactly; any
optimizer, audit, evaluation, flush) or the padded exchange (:mod:`hetgmp.embedding.padded`).

(No imports here: the stepper and the padded exchange use each other's modules, and a package
that imported its modules would join them into an import cycle.)
"""
