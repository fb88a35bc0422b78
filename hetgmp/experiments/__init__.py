"""Experiments users run to tune the system: store-rate sweeps, staleness ablations, and a
comparison of partition methods (predicted cost vs measured communication).

``sweep`` holds the shared machinery (run table with resume, mpirun launch, repeats, progress),
``store_rate`` / ``staleness`` / ``partition_compare`` the three experiments, ``plots`` and
``report`` the PNG and markdown outputs, ``cli`` the ``hetgmp experiment`` subcommands.
"""
