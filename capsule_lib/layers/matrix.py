"""Convolutional and class matrix capsules with EM routing (Hinton et al. 2018): the layers around
:func:`~capsule_lib.routing.em.em_routing`."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .._checks import check_activations, check_module_input, check_poses, check_tensor
from ..routing.em import EMRoutingBase

__all__ = ["ConvCapsules", "ClassCapsules", "grid_centers"]


def _check_grid(poses: torch.Tensor, acts: torch.Tensor, n_types: int, pose_size: int) -> None:
    d = pose_size**2
    spec = f"[B, n_types={n_types}, H, W, d={d}]"
    check_poses(poses, pose_size, spec, 5)
    check_tensor(poses, "poses", spec, [None, n_types, None, None, d])
    B, T, H, W, _ = poses.shape
    check_tensor(acts, "activations", f"[B, n_types={n_types}, H, W]", [None, n_types, None, None])
    if tuple(acts.shape) != (B, T, H, W):
        raise ValueError(
            f"activations: expected shape [B, n_types, H, W] = {(B, T, H, W)} (matching poses), got {tuple(acts.shape)}"
        )
    check_activations(acts)


class ConvCapsules(EMRoutingBase):
    """Convolutional matrix capsules with EM routing:
    ``poses [B, T_in, H, W, P*P], activations [B, T_in, H, W] -> ([B, T_out, h, w, P*P], [B, T_out, h, w])``.

    One ``P x P`` transformation per (kernel offset, input type, output type), shared over positions:
    ``weight [K, K, T_in, T_out, P, P]`` plus ``beta_u``, ``beta_a [T_out]`` (``K*K*T_in*T_out*P*P + 2*T_out``
    parameters). The ``K*K*T_in`` children of each output position's window vote ``V = M W`` (4x4 matrix
    product) for the ``T_out`` parents at that position, and EM routing runs over that window.

    Windows are gathered with ``F.unfold`` and routed **independently per output position**: a child that
    lies in several overlapping windows (K > stride) is assigned separately in each, so its R does not
    sum to 1 over *all* parents at all positions that see it (Gritzman's "pitfall 3"; the IBM code shares
    one R across windows). ``h = (H + 2*padding - K) // stride + 1``; zero padding adds children with
    activation 0, which carry no weight.

    Parameters
    ----------
    in_types : int
        Input capsule types ``T_in``.
    out_types : int
        Output capsule types ``T_out``.
    kernel_size : int, optional
        Window side ``K`` (default 3).
    stride : int, optional
        Window stride (default 1).
    padding : int, optional
        Zero padding of the child grid on each side (default 0).
    pose_size : int, optional
        Pose matrices are ``P x P`` (default 4).
    iterations : int, optional
        EM iterations, >= 1 (default 3, the paper's); a call may override it.
    init_std : float or None, optional
        Standard deviation of the ``N(0, std^2)`` transformation weights; ``None`` (default) uses ``1/sqrt(P)``
        (vote variance = pose variance).
    \\*\\*routing
        The routing options of :class:`~capsule_lib.routing.em.EMRoutingBase` (``inverse_temperature``,
        ``normalize_over_outputs``, ``normalize_costs``, ``eps``).
    """

    def __init__(
        self,
        in_types: int,
        out_types: int,
        kernel_size: int = 3,
        stride: int = 1,
        padding: int = 0,
        pose_size: int = 4,
        iterations: int = 3,
        *,
        init_std: float | None = None,
        **routing: Any,
    ) -> None:
        super().__init__(out_types, iterations, **routing)
        self.in_types, self.out_types, self.kernel_size = in_types, out_types, kernel_size
        self.stride, self.padding, self.pose_size = stride, padding, pose_size
        self.weight = self.pose_weight((kernel_size, kernel_size, in_types, out_types, pose_size, pose_size), init_std)

    def output_size(self, size: int) -> int:
        """Side of the output grid for an input grid side.

        Parameters
        ----------
        size : int
            Input grid height or width ``H``.

        Returns
        -------
        int
            ``h = (size + 2*padding - K) // stride + 1`` (< 1 when the grid is smaller than the kernel).
        """
        return (size + 2 * self.padding - self.kernel_size) // self.stride + 1

    def votes(self, poses: torch.Tensor, acts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Window votes ``[B, h, w, K*K*T_in, T_out, P*P]`` and children activations ``[B, h, w, K*K*T_in]``
        (child index ``i = (u*K + v)*T_in + t``).

        The votes are stored parent-major (a ``transpose(-3, -2)`` view of a contiguous
        ``[B, h, w, T_out, K*K*T_in, P*P]`` tensor), the layout :func:`~capsule_lib.routing.em.em_routing`
        routes in, so that it needs no copy.

        Parameters
        ----------
        poses : torch.Tensor
            ``[B, T_in, H, W, P*P]`` child poses (row-major ``P x P`` matrices).
        acts : torch.Tensor
            ``[B, T_in, H, W]`` child activations in [0, 1].

        Returns
        -------
        votes : torch.Tensor
            ``[B, h, w, K*K*T_in, T_out, P*P]`` window votes ``V = M W``.
        acts : torch.Tensor
            ``[B, h, w, K*K*T_in]`` the windows' child activations (0 for padding).
        """
        P, K, T, D = self.pose_size, self.kernel_size, self.in_types, self.pose_size**2
        _check_grid(poses, acts, T, P)
        B, _, H, W, _ = poses.shape
        h, w = self.output_size(H), self.output_size(W)
        if h < 1 or w < 1:
            raise ValueError(f"poses: grid {H}x{W} is smaller than the kernel {K} (padding {self.padding})")
        x = poses.permute(0, 1, 4, 2, 3).reshape(B, T * D, H, W)  # [B, T*D, H, W]
        cols = F.unfold(x, K, padding=self.padding, stride=self.stride)  # [B, T*D*K*K, h*w]
        M = cols.view(B, T, P, P, K, K, h, w)  # [B, t, p, q, u, v, h, w]
        V = torch.einsum("btpquvhw,uvtjqr->bhwjuvtpr", M, self.weight)  # [B, h, w, J, K, K, T, P, P]
        V = V.reshape(B, h, w, self.out_types, K * K * T, D).transpose(-3, -2)  # [B, h, w, I, J, D] (view)
        ac = F.unfold(acts, K, padding=self.padding, stride=self.stride)  # [B, T*K*K, h*w]
        ac = ac.view(B, T, K, K, h, w).permute(0, 4, 5, 2, 3, 1).reshape(B, h, w, K * K * T)  # [B, h, w, I]
        return V, ac

    def forward(
        self, poses: torch.Tensor, acts: torch.Tensor, return_routing: bool = False, iterations: int | None = None
    ):
        """``(poses [B, T, H, W, P*P], acts [B, T, H, W])`` -> ``(mu [B, J, h, w, P*P], a_out [B, J, h, w])``.

        Parameters
        ----------
        poses, acts : torch.Tensor
            As in :meth:`votes`.
        return_routing : bool, optional
            Also return the routing trace (default ``False``).
        iterations : int, optional
            EM iterations for this call, >= 1; ``None`` (default) uses the layer's.

        Returns
        -------
        tuple of torch.Tensor
            ``(mu [B, T_out, h, w, P*P], a_out [B, T_out, h, w])``: output poses and activations.
            With ``return_routing=True``, ``((mu, a_out), trace)``: ``trace`` is the
            :class:`~capsule_lib.types.RoutingTrace` of :func:`~capsule_lib.routing.em.em_routing`.
        """
        check_module_input(poses, self, type(self).__name__)
        V, a = self.votes(poses, acts)  # [B, h, w, I, J, D], [B, h, w, I]
        out = self.route_votes(V, a, return_routing, iterations)
        (mu, a_out), trace = out if return_routing else (out, None)
        mu = mu.permute(0, 3, 1, 2, 4)  # [B, J, h, w, D]
        a_out = a_out.permute(0, 3, 1, 2)  # [B, J, h, w]
        return ((mu, a_out), trace) if return_routing else (mu, a_out)

    def extra_repr(self) -> str:
        return (
            f"in_types={self.in_types}, out_types={self.out_types}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, " + self._repr()
        )


def grid_centers(height: int, width: int, device=None, dtype=torch.float32, convention: str = "center") -> torch.Tensor:
    """Scaled coordinates of the cells of a ``height x width`` grid, ``[H, W, 2]`` (row, column).

    Parameters
    ----------
    height : int
        Grid rows ``H``.
    width : int
        Grid columns ``W``.
    device : torch.device or str, optional
        Device of the result (default: PyTorch's default device).
    dtype : torch.dtype, optional
        dtype of the result (default ``torch.float32``).
    convention : str, optional
        ``"center"`` (default): cell centres ``((y + 0.5) / H, (x + 0.5) / W)`` (in (0, 1), symmetric);
        ``"corner"``: ``(y / H, x / W)`` (in [0, 1), yl-1993's ``arange(H) / H``). Anything else raises
        ``ValueError``.

    Returns
    -------
    torch.Tensor
        ``[H, W, 2]`` (row, column) coordinates.
    """
    if convention not in ("center", "corner"):
        raise ValueError(f"convention must be 'center' or 'corner', got {convention!r}")
    off = 0.5 if convention == "center" else 0.0
    ys = (torch.arange(height, device=device, dtype=dtype) + off) / height  # [H]
    xs = (torch.arange(width, device=device, dtype=dtype) + off) / width  # [W]
    return torch.stack(torch.meshgrid(ys, xs, indexing="ij"), dim=-1)  # [H, W, 2]


class ClassCapsules(EMRoutingBase):
    """Class capsules with EM routing from every position and type:
    ``poses [B, T, H, W, P*P], activations [B, T, H, W] -> (poses [B, K, P*P], activations [B, K])``.

    One ``P x P`` transformation per (input type, class), shared over positions: ``weight [T, K, P, P]`` plus
    ``beta_u``, ``beta_a [K]`` (``T*K*P*P + 2*K`` parameters). Children are all ``H*W*T`` capsules (order
    ``i = (y*W + x)*T + t``).

    **Coordinate addition** (paper, Sec. 3): the scaled (row, column) coordinates of the centre of each
    child's receptive field are added to the first two elements of the right-hand column of its vote
    matrix, i.e. flat entries ``(P-1, 2P-1)`` = ``(3, 7)`` for 4x4 row-major poses. ``centers [H, W, 2]`` (row,
    column) are passed by the model (receptive-field centres in the image, scaled to ``[0, 1]``); without them
    the child grid's own cell centres :func:`grid_centers` are used. yl-1993 adds ``arange(H)/H`` to flat
    entries ``(0, 1)`` instead: ``coord_entries=(0, 1)``.

    Parameters
    ----------
    in_types : int
        Input capsule types ``T``.
    n_classes : int
        Class capsules ``K``.
    pose_size : int, optional
        Pose matrices are ``P x P`` (default 4).
    iterations : int, optional
        EM iterations, >= 1 (default 3, the paper's); a call may override it.
    coord_add : bool, optional
        Coordinate addition (default ``True``).
    coord_entries : tuple of int or None, optional
        The two distinct flat pose entries in ``[0, P*P)`` that receive the row and the column coordinate;
        ``None`` (default) for ``(P-1, 2P-1)``.
    init_std : float or None, optional
        As in :class:`ConvCapsules`.
    \\*\\*routing
        The routing options of :class:`~capsule_lib.routing.em.EMRoutingBase`.
    """

    def __init__(
        self,
        in_types: int,
        n_classes: int,
        pose_size: int = 4,
        iterations: int = 3,
        *,
        coord_add: bool = True,
        coord_entries: tuple[int, int] | None = None,
        init_std: float | None = None,
        **routing: Any,
    ) -> None:
        super().__init__(n_classes, iterations, **routing)
        self.in_types, self.n_classes, self.pose_size, self.coord_add = in_types, n_classes, pose_size, coord_add
        D = pose_size**2
        entries = coord_entries if coord_entries is not None else (pose_size - 1, 2 * pose_size - 1)
        if not all(0 <= e < D for e in entries) or entries[0] == entries[1]:
            raise ValueError(f"coord_entries must be two distinct indices in [0, {D}), got {entries}")
        self.coord_entries = tuple(entries)
        basis = torch.zeros(2, D)
        basis[0, entries[0]] = 1.0  # row coordinate
        basis[1, entries[1]] = 1.0  # column coordinate
        self.register_buffer("coord_basis", basis, persistent=False)  # [2, D]
        self.weight = self.pose_weight((in_types, n_classes, pose_size, pose_size), init_std)

    def votes(
        self, poses: torch.Tensor, acts: torch.Tensor, centers: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Votes (with coordinate addition) and activations of the ``H*W*T`` children; the votes are stored
        parent-major (a ``transpose(1, 2)`` view of a contiguous ``[B, K, H*W*T, P*P]`` tensor), the layout
        :func:`~capsule_lib.routing.em.em_routing` routes in.

        Parameters
        ----------
        poses : torch.Tensor
            ``[B, T, H, W, P*P]`` child poses.
        acts : torch.Tensor
            ``[B, T, H, W]`` child activations in [0, 1].
        centers : torch.Tensor, optional
            ``[H, W, 2]`` (row, column) coordinates to add; ``None`` (default) uses :func:`grid_centers`. Unused
            without ``coord_add``.

        Returns
        -------
        votes : torch.Tensor
            ``[B, H*W*T, K, P*P]``, child ``i = (y*W + x)*T + t``.
        acts : torch.Tensor
            ``[B, H*W*T]`` child activations in the same order.
        """
        P, T, D = self.pose_size, self.in_types, self.pose_size**2
        _check_grid(poses, acts, T, P)
        B, _, H, W, _ = poses.shape
        M = poses.reshape(B, T, H, W, P, P)  # [B, T, H, W, P, P]
        V = torch.einsum("bthwpq,tjqr->bjhwtpr", M, self.weight)  # [B, K, H, W, T, P, P]
        V = V.reshape(B, self.n_classes, H, W, T, D)  # [B, K, H, W, T, D] contiguous
        if self.coord_add:
            if centers is None:
                centers = grid_centers(H, W, device=V.device)
            check_tensor(centers, "centers", f"[H={H}, W={W}, 2]", [H, W, 2])
            offset = torch.einsum("hwc,cd->hwd", centers.to(self.coord_basis.dtype), self.coord_basis)  # [H, W, D]
            V = V + offset[:, :, None, :].to(V.dtype)  # [B, K, H, W, T, D]
        V = V.reshape(B, self.n_classes, H * W * T, D).transpose(1, 2)  # [B, I, K, D] (view)
        a = acts.permute(0, 2, 3, 1).reshape(B, H * W * T)  # [B, I]
        return V, a

    def forward(
        self,
        poses: torch.Tensor,
        acts: torch.Tensor,
        centers: torch.Tensor | None = None,
        return_routing: bool = False,
        iterations: int | None = None,
    ):
        """Route every child to the class capsules.

        :meth:`votes` (coordinate addition included), routed by
        :meth:`~capsule_lib.routing.em.EMRoutingBase.route_votes`.

        Parameters
        ----------
        poses, acts, centers : torch.Tensor
            As in :meth:`votes` (``centers`` optional, default ``None``).
        return_routing, iterations : optional
            As in :meth:`ConvCapsules.forward`.

        Returns
        -------
        tuple of torch.Tensor
            ``(mu [B, K, P*P], a_out [B, K])``: class poses and activations; with ``return_routing=True``,
            ``((mu, a_out), trace)`` as in :meth:`ConvCapsules.forward`.
        """
        V, a = self.votes(poses, acts, centers)
        return self.route_votes(V, a, return_routing, iterations)

    def extra_repr(self) -> str:
        return (
            f"in_types={self.in_types}, n_classes={self.n_classes}, coord_add={self.coord_add}, "
            f"coord_entries={self.coord_entries}, " + self._repr()
        )
