"""The asynchronous step engine (``--sync async``): each rank serves its owned rows from a
ZeroMQ service thread and steps at its own pace (docs/architecture.md)."""
