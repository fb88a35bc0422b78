"""Communication and read-path counters of the embedding runtime."""

from __future__ import annotations

import torch

from hetgmp.counter_names import COUNTER_NAMES, ROW_KINDS


def zero_counters() -> dict[str, int]:
    return dict.fromkeys(COUNTER_NAMES, 0)


def format_counters(c: dict[str, int]) -> str:
    """One parseable ``key=value`` log line."""
    return " ".join(f"{k}={c[k]}" for k in COUNTER_NAMES if k in c)


class StepCounters:
    """A table's counters, per step and in total. Host-known parts (bytes, owned / not-stored
    rows) are Python ints; the mirror fresh / stale-ok / refreshed / deferred counts (and, on
    the one-rank path, the distinct owned rows) stay in device vectors until read: reading
    them would wait for the device."""

    def __init__(self, device: torch.device) -> None:
        self.bytes_total = zero_counters()
        self.bytes_step = zero_counters()
        self.rows_host_total = {"owned": 0, "not_stored": 0}
        self.rows_host_step = dict(self.rows_host_total)
        # [fresh, stale-ok, refreshed, deferred, owned (one-rank path: not host-known)]
        self.rows_dev_total = torch.zeros(5, dtype=torch.int64, device=device)
        self.rows_dev_step = torch.zeros_like(self.rows_dev_total)
        # One rank: the distinct-row counts (step, total) its lookup kernel adds to in place
        # (views made once) and the step's byte counts (constant: nothing is sent; one dict
        # for every step, copied by step()).
        self.local_counts = (self.rows_dev_step[4:], self.rows_dev_total[4:])
        self.local_bytes_step = zero_counters()
        self.local_bytes_step["steps"] = 1
        # steps replayed from a whole-step graph with several ranks: their owned rows, rows
        # not stored here and pushes, summed on the device (hetgmp.embedding.padded.whole)
        # (and [3]: due pushes deferred for want of room in a fixed push payload)
        self.replay_dev = torch.zeros(4, dtype=torch.int64, device=device)

    def total(self) -> dict[str, int]:
        """Cumulative counters (bytes by kind, rows by source, pushes)."""
        owned, not_stored, pushes, cap_deferred = (int(v) for v in self.replay_dev.tolist())
        host = dict(self.bytes_total)
        host["pushes_sent"] += pushes
        host["pushes_capacity_deferred"] = cap_deferred
        rows = {"owned": self.rows_host_total["owned"] + owned}
        rows["not_stored"] = self.rows_host_total["not_stored"] + not_stored
        return _merge(host, rows, self.rows_dev_total)

    def step(self) -> dict[str, int]:
        """The last step's counters."""
        return _merge(self.bytes_step, self.rows_host_step, self.rows_dev_step)

    def count_bytes(self, *, sent: dict[str, int], recv: dict[str, int], reset: bool) -> None:
        """Add a step's bytes by kind (``reset``: this is the step's first exchange)."""
        if reset:
            self.bytes_step = {k: 0 for k in self.bytes_step}
            self.bytes_step["steps"] = 1
            self.bytes_total["steps"] += 1
        for prefix, part in (("bytes_sent_", sent), ("bytes_recv_", recv)):
            for k, v in part.items():
                self.bytes_step[prefix + k] += v
                self.bytes_total[prefix + k] += v

    def count_pushes(self, n: int) -> None:
        self.bytes_step["pushes_sent"] = n
        self.bytes_total["pushes_sent"] += n

    def count_local_step(self) -> None:
        """A one-rank step: nothing sent (its distinct rows were counted on the device)."""
        self.bytes_step = self.local_bytes_step
        self.bytes_total["steps"] += 1

    def set_rows_host(self, owned: int, not_stored: int) -> None:
        self.rows_host_step = {"owned": owned, "not_stored": not_stored}

    def accumulate_rows(self, *, device_part: bool = True) -> None:
        """Add the step's row counts to the totals (``device_part`` false: the device vector
        was added in a captured graph already)."""
        if device_part:
            self.rows_dev_total += self.rows_dev_step
        for k, v in self.rows_host_step.items():
            self.rows_host_total[k] += v


def _merge(
    byte_counts: dict[str, int], rows_host: dict[str, int], rows_dev: torch.Tensor
) -> dict[str, int]:
    out = dict(byte_counts)
    fresh, stale_ok, refreshed, deferred, owned_dev = (int(v) for v in rows_dev.tolist())
    out["rows_owned"] = rows_host["owned"] + owned_dev
    out["rows_mirror_fresh"] = fresh
    out["rows_mirror_stale_ok"] = stale_ok
    out["rows_remote"] = rows_host["not_stored"] + refreshed
    out["rows_mirror_refreshed"] = refreshed
    out["pushes_deferred"] = deferred
    out["rows_requested"] = sum(out[f"rows_{k}"] for k in ROW_KINDS)
    return out
