"""hetgmp: train CTR models whose embedding tables are too big and too hot for one device.

Offline, :mod:`hetgmp.partition` places samples and embedding rows on workers so that each
worker mostly touches rows it owns; online, :mod:`hetgmp.embedding` keeps primary rows plus
mirrors of hot remote rows, synchronised under a bounded staleness.
"""

__version__ = "0.1.0"
