"""Masking the class capsules before the decoder: by the label while training, by the longest capsule(s) otherwise."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_tensor
from ..functional import capsule_lengths

__all__ = ["mask_capsules", "Mask"]


def mask_capsules(v: torch.Tensor, y: torch.Tensor | None = None, k: int = 1) -> torch.Tensor:
    """Zero every capsule except the selected ones: ``[B, J, D] -> [B, J, D]``.

    Parameters
    ----------
    v : torch.Tensor
        ``[B, J, D]`` capsules.
    y : torch.Tensor, optional
        What to keep: integer labels ``[B]`` (the label's capsule), integer labels ``[B, k]`` with ``k != J``
        (those ``k`` capsules), or a ``[B, J]`` 0/1 mask (multiplied in as it is). ``None`` (default): the ``k``
        longest capsules. Any other shape raises ``ValueError``.
    k : int, optional
        Capsules kept when ``y`` is ``None`` (default 1; 2 for MultiMNIST).

    Returns
    -------
    torch.Tensor
        ``[B, J, D]``: ``v`` with every capsule that is not selected set to zero.
    """
    check_tensor(v, "v", "[B, J, D]", [None, None, None])
    B, J, _ = v.shape
    if y is None:
        idx = capsule_lengths(v).topk(k, dim=1).indices  # [B, k]
        m = torch.zeros(B, J, dtype=v.dtype, device=v.device).scatter_(1, idx, 1.0)
    elif y.dim() == 1:
        m = F.one_hot(y.long(), J).to(v.dtype)
    elif y.dim() == 2 and y.dtype in (torch.int64, torch.int32) and y.shape[1] != J:
        m = torch.zeros(B, J, dtype=v.dtype, device=v.device).scatter_(1, y.long(), 1.0)
    elif y.dim() == 2 and y.shape[1] == J:
        m = y.to(v.dtype)
    else:
        raise ValueError(f"y: expected labels [B], [B, k] or a mask [B, {J}], got {tuple(y.shape)}")
    return v * m.unsqueeze(-1)


class Mask(nn.Module):
    """Module form of :func:`mask_capsules`.

    Parameters
    ----------
    k : int, optional
        Capsules kept when no ``y`` is given (default 1; 2 for MultiMNIST).
    """

    def __init__(self, k: int = 1) -> None:
        super().__init__()
        self.k = k

    def forward(self, v: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """:func:`mask_capsules` with the module's ``k``.

        Parameters
        ----------
        v : torch.Tensor
            ``[B, J, D]`` capsules.
        y : torch.Tensor, optional
            Labels ``[B]``, labels ``[B, k]`` or a ``[B, J]`` 0/1 mask (see :func:`mask_capsules`); ``None``
            (default) keeps the ``k`` longest capsules.

        Returns
        -------
        torch.Tensor
            ``[B, J, D]``: ``v`` with every capsule that is not selected set to zero.
        """
        return mask_capsules(v, y, self.k)
