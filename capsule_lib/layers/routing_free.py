"""Capsule layers without routing, from the critics of routing (the chapter "Do capsules need routing?").

Index names::

    b  batch      i  input capsule      j  output (class) capsule      d / e  capsule dimension      t  input type

**Homogeneous vector capsules** (Byerly, Kalganova & Dear 2021, "No routing needed between capsules"; the authors'
code ``AdamByerly/BMCNNwHFCs``, ``hvc_from_xyz``): each input capsule is multiplied *element-wise* by one weight
vector per class (no matrix: the capsule's dimensions are never mixed), the products are summed over the inputs,
batch-normalised and rectified; a class's score is its capsule's length::

    v_j = ReLU( BN( sum_i w_ji * u_i ) )          [B, n_out, d]; BN: statistics per dimension over the batch and the
                                                  classes, a learned shift, no scale (the authors' batch_norm)

**Shared transforms, no routing** (Gu & Tresp 2020, "Improving the robustness of capsule networks to image affine
transformations"): the votes are not routed, every coupling is ``1 / n_out`` (the first iteration of dynamic routing,
Sabour et al.'s r = 1), and the transformation matrices are shared by many input capsules. ``shared="all"`` is Gu &
Tresp's Aff-CapsNets as their paper describes them: one matrix per class for *every* primary capsule, whatever its
type and position; ``shared="type"`` (the book's first reading of their change) one matrix per (input capsule
*type*, class), the same at every position of the type::

    u_hat_{j|i} = W_{g(i), j}^T u_i ;   v_j = squash( sum_i u_hat_{j|i} / n_out )          [B, n_out, e]

with ``g(i)`` the type of ``i`` (``"type"``) or one group for all (``"all"``). As ``W`` is linear, the layer sums
each group's capsules first and transforms the sums: the class capsules see no position at all.
"""

from __future__ import annotations

import torch
from torch import nn

from .._checks import check_choice, check_nonempty, check_tensor
from ..functional import capsule_lengths, squash

__all__ = ["homogeneous_vector_capsules_reference", "HomogeneousVectorCapsules", "SHARED", "SharedTransformCapsules"]


def homogeneous_vector_capsules_reference(
    u: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, eps: float = 1e-3
) -> torch.Tensor:
    """Homogeneous vector capsules as the authors' code computes them in training mode (batch statistics).

    ``u [B, n_inp, d]``, ``weight [n_out, n_inp, d]``, ``shift [d]`` -> class capsules ``[B, n_out, d]``. This is
    the definition: :class:`HomogeneousVectorCapsules` computes the same values and gradients (tested in float64).
    """
    s = torch.einsum("bid,jid->bjd", u, weight)  # [B, j, d] sum_i w_ji * u_i
    mean = s.mean((0, 1))  # [d] over the batch and the classes
    var = s.var((0, 1), unbiased=False)  # [d]
    return torch.relu((s - mean) / torch.sqrt(var + eps) + shift)  # [B, j, d]


class HomogeneousVectorCapsules(nn.Module):
    """Homogeneous vector capsules (see the module docstring): ``[B, n_inp, d] -> [B, n_out, d]``, no routing.

    Parameters
    ----------
    n_inp, n_out : int
        Numbers of input and output (class) capsules.
    d : int
        Capsule dimension, the same in and out (the weights are vectors).
    init_std : float, optional
        Std of the ``N(0, init_std^2)`` weights (default 0.05, TensorFlow's ``random_normal_initializer``, which the
        authors' code uses).
    eps, momentum : float, optional
        The batch norm's epsilon (default 1e-3, the authors') and running-statistics momentum (default 0.1,
        PyTorch's; the authors' decay of 0.9997 suits their runs of hundreds of epochs, not a short budget).

    Notes
    -----
    ``scores(v)`` gives the class scores, the capsules' lengths.
    """

    def __init__(
        self, n_inp: int, n_out: int, d: int, init_std: float = 0.05, eps: float = 1e-3, momentum: float = 0.1
    ) -> None:
        super().__init__()
        self.n_inp, self.n_out, self.d = n_inp, n_out, d
        self.weight = nn.Parameter(torch.randn(n_out, n_inp, d) * init_std)
        self.norm = nn.BatchNorm1d(d, eps=eps, momentum=momentum, affine=False)
        self.shift = nn.Parameter(torch.zeros(d))

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """``u [B, n_inp, d]`` -> ``v [B, n_out, d]`` (batch statistics in training mode, running ones in eval)."""
        spec = f"[B, n_inp={self.n_inp}, d={self.d}]"
        check_tensor(u, "u", spec, [None, self.n_inp, self.d])
        check_nonempty(u, "u", spec)
        s = torch.einsum("bid,jid->bjd", u, self.weight)  # [B, j, d]
        s = self.norm(s.reshape(-1, self.d)).view_as(s)  # statistics per d over the batch and the classes
        return torch.relu(s + self.shift)  # [B, j, d]

    @staticmethod
    def scores(v: torch.Tensor) -> torch.Tensor:
        """Class scores ``[B, n_out]``: the capsules' lengths."""
        return capsule_lengths(v)

    def extra_repr(self) -> str:
        return f"n_inp={self.n_inp}, n_out={self.n_out}, d={self.d}"


#: what :class:`SharedTransformCapsules` shares one transformation matrix across (per class)
SHARED = ("type", "all")


class SharedTransformCapsules(nn.Module):
    """Class capsules from votes made by shared transforms, without routing (see the module docstring):
    ``[B, n_types * n_positions, d_inp] -> [B, n_out, d_out]``.

    Input capsule ``i`` is of type ``i // n_positions`` (type-major, as :class:`~capsule_lib.layers.PrimaryCapsules`
    orders them).

    Parameters
    ----------
    n_types, n_positions : int
        Input capsule types and positions per type.
    n_out : int
        Output (class) capsules.
    d_inp, d_out : int
        Capsule dimensions.
    init_std : float, optional
        Std of the ``N(0, init_std^2)`` weights (default 0.01, as the dynamic-routing layer's).
    shared : str, optional
        ``"type"`` (default): one matrix per (type, class), shared by the type's positions; ``"all"``: one matrix per
        class, shared by every input capsule (Gu & Tresp's Aff-CapsNets).
    """

    def __init__(
        self,
        n_types: int,
        n_positions: int,
        n_out: int,
        d_inp: int,
        d_out: int,
        init_std: float = 0.01,
        shared: str = "type",
    ) -> None:
        super().__init__()
        check_choice(shared, SHARED, "shared")
        self.n_types, self.n_positions, self.n_out, self.d_inp, self.d_out = n_types, n_positions, n_out, d_inp, d_out
        self.shared = shared
        groups = n_types if shared == "type" else 1
        self.weight = nn.Parameter(torch.randn(groups, n_out, d_inp, d_out) * init_std)  # [g, j, d, e]

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        """``u [B, n_types * n_positions, d_inp]`` -> ``v [B, n_out, d_out]``."""
        spec = f"[B, n_inp={self.n_types * self.n_positions}, d_inp={self.d_inp}]"
        check_tensor(u, "u", spec, [None, self.n_types * self.n_positions, self.d_inp])
        check_nonempty(u, "u", spec)
        groups = self.weight.shape[0]
        per_group = u.view(u.shape[0], groups, -1, self.d_inp).sum(2)  # [B, g, d]: W is linear, sum first
        s = torch.einsum("bgd,gjde->bje", per_group, self.weight) / self.n_out  # [B, j, e] couplings 1 / n_out
        return squash(s, "hinton")  # [B, j, e]

    @staticmethod
    def scores(v: torch.Tensor) -> torch.Tensor:
        """Class scores ``[B, n_out]``: the capsules' lengths."""
        return capsule_lengths(v)

    def extra_repr(self) -> str:
        return (
            f"n_types={self.n_types}, n_positions={self.n_positions}, n_out={self.n_out}, "
            f"d_inp={self.d_inp}, d_out={self.d_out}, shared={self.shared!r}"
        )
