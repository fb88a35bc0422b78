"""Exact classification metrics over a whole split (not averages of per-batch values)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # (torch is imported by the tensor functions only: `hetgmp generate`, which
    import torch  # scores its best AUC with roc_auc, starts ~1 s sooner without it)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney U with average ranks for ties).

    Returns NaN when only one class is present.
    """
    y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    s = np.asarray(scores, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.size} vs {s.size}")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    s_sorted = s[order]
    # average 1-based ranks over runs of tied scores
    boundaries = np.flatnonzero(np.diff(s_sorted)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [s.size]])
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat(avg_rank, ends - starts)
    u = ranks[y].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-(y * np.log(p) + (1 - y) * np.log1p(-p)).mean())


def accuracy(labels: np.ndarray, probs: np.ndarray) -> float:
    y = np.asarray(labels).ravel() > 0.5
    return float(((np.asarray(probs).ravel() > 0.5) == y).mean())


# ---- the same metrics on (device) tensors, for evaluation without leaving the device ----------
# They equal the numpy functions above: AUC bit for bit (the rank sums are integers, summed
# exactly in int64), logloss up to float64 summation order, accuracy exactly.


def roc_auc_tensor(labels: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """:func:`roc_auc` as a float64 0-d tensor on the inputs' device (NaN for one class)."""
    import torch

    y = labels.reshape(-1) > 0.5
    s = scores.reshape(-1).to(torch.float64)
    if y.shape != s.shape:
        raise ValueError(f"labels and scores differ in length: {y.numel()} vs {s.numel()}")
    n = s.numel()
    order = torch.argsort(s, stable=True)
    y_sorted = y[order].to(torch.int64)
    _, counts = torch.unique_consecutive(s[order], return_counts=True)
    ends = counts.cumsum(0)
    starts = ends - counts
    cum = torch.cat([y_sorted.new_zeros(1), y_sorted.cumsum(0)])
    pos_in_run = cum[ends] - cum[starts]
    # twice the sum of the positives' average 1-based ranks: (start + end + 1) per run member
    twice_rank_sum = (pos_in_run * (starts + ends + 1)).sum()
    n_pos = y_sorted.sum()
    n_neg = n - n_pos
    u = twice_rank_sum.to(torch.float64) / 2.0 - (n_pos * (n_pos + 1)).to(torch.float64) / 2.0
    auc = u / (n_pos * n_neg).to(torch.float64)
    return torch.where((n_pos == 0) | (n_neg == 0), torch.full_like(auc, float("nan")), auc)


def log_loss_tensor(labels: torch.Tensor, probs: torch.Tensor, eps: float = 1e-7) -> torch.Tensor:
    """:func:`log_loss` as a float64 0-d tensor."""
    import torch

    y = labels.reshape(-1).to(torch.float64)
    p = probs.reshape(-1).to(torch.float64).clamp(eps, 1 - eps)
    return -(y * torch.log(p) + (1 - y) * torch.log1p(-p)).mean()


def accuracy_tensor(labels: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """:func:`accuracy` as a float64 0-d tensor."""
    import torch

    return ((probs.reshape(-1) > 0.5) == (labels.reshape(-1) > 0.5)).to(torch.float64).mean()
