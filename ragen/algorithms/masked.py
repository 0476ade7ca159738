"""Masked statistics, batch whitening and group-relative normalisation.

Variance convention: :func:`masked_whiten` uses the *population* variance (divide by N) by default, so the
whitened entries have masked mean 0 and masked population variance 1 (up to ``eps``); pass ``unbiased=True``
for the Bessel-corrected variance (divide by N - 1). Group normalisation (:func:`group_normalize`, GRPO's
``(x - mean) / (std + eps)``) uses the *unbiased* std, as GRPO does.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is nonzero (entries outside the mask never leak, even NaN/inf)."""
    vals = torch.where(mask.bool(), x, torch.zeros_like(x))
    return vals.sum() if dim is None else vals.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over ``mask`` (0 when the mask is empty)."""
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim=dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_var(x: Tensor, mask: Tensor, *, unbiased: bool = False) -> Tensor:
    """Variance of ``x`` over ``mask``: population (/N) by default, Bessel-corrected (/(N-1)) if ``unbiased``.

    Fewer than two masked entries give 0 in the unbiased case (and 0 for an empty mask).
    """
    m = mask.bool()
    n = m.sum().to(x.dtype)
    dev = torch.where(m, x - masked_mean(x, m), torch.zeros_like(x))
    denom = (n - 1) if unbiased else n
    return dev.square().sum() / denom.clamp(min=1)


def masked_whiten(
    x: Tensor, mask: Tensor, *, eps: float = 1e-6, unbiased: bool = False, shift_mean: bool = True
) -> Tensor:
    """Whiten ``x`` over the masked entries of the whole tensor: ``(x - mean) / (std + eps)``.

    x, mask: same shape (e.g. (B, T) advantages and the response mask). The std is the population std unless
    ``unbiased``. With ``shift_mean=False`` the mean is added back (scale only). Entries outside the mask are 0.
    """
    m = mask.bool()
    mean = masked_mean(x, m)
    std = masked_var(x, m, unbiased=unbiased).sqrt()
    out = (x - mean) / (std + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))


def group_normalize(
    x: Tensor, group_ids: Tensor, valid: Tensor | None = None, *, eps: float = 1e-6, norm_by_std: bool = True
) -> Tensor:
    """Group-relative normalisation Ahat (GRPO, Shao et al. 2024, eq. for outcome supervision).

    x: (N,) scores; group_ids: (N,) any integers (equal id = same group); valid: (N,) bool, entries that take
    part (others get 0 and do not count). Each valid entry gets ``(x - mean) / (std + eps)`` over the valid
    entries of its group, with the unbiased std, or ``x - mean`` when ``norm_by_std`` is False. A group whose
    valid values are all equal (including a singleton group) gives exactly 0.
    """
    if valid is None:
        valid = torch.ones_like(x, dtype=torch.bool)
    valid = valid.bool()
    if x.numel() == 0:
        return torch.zeros_like(x)
    _, inv = torch.unique(group_ids, return_inverse=True)
    G = int(inv.max()) + 1
    w = valid.to(x.dtype)
    count = torch.zeros(G, dtype=x.dtype, device=x.device).index_add_(0, inv, w)
    mean = torch.zeros_like(count).index_add_(0, inv, x * w) / count.clamp(min=1)
    dev = (x - mean[inv]) * w
    var = torch.zeros_like(count).index_add_(0, inv, dev.square()) / (count - 1).clamp(min=1)
    big = torch.finfo(x.dtype).max
    gmax = torch.full_like(count, -big).scatter_reduce_(0, inv, torch.where(valid, x, -big), "amax")
    gmin = torch.full_like(count, big).scatter_reduce_(0, inv, torch.where(valid, x, big), "amin")
    out = dev / (var.sqrt()[inv] + eps) if norm_by_std else dev
    constant = (gmax == gmin)[inv]
    return torch.where(valid & ~constant, out, torch.zeros_like(out))
