"""Helpers shared by the routing algorithms (private)."""

from __future__ import annotations

from typing import Any

import torch

from .._checks import check_choice, check_no_nan, check_nonempty, check_tensor
from ..types import COUPLINGS, Routed, RoutingTrace


class RoutingProtocol:
    """The routing protocol, the one way every registered routing layer is called (:mod:`capsule_lib.routing.kinds`).

    A layer mixes this in before ``nn.Module`` and implements ``_routed(poses, activations, iterations,
    return_routing) -> Routed`` (with ``refuse_activations`` or ``require_activations``), the classmethod
    ``fully_connected(n_inp, n_out, d, iterations)``, the registry's constructor, and ``_coupled(poses, activations,
    R) -> Routed``: one pass of its algorithm with the couplings ``R [B, n_inp, n_out]`` given (no trace) instead of
    found by agreement, in plain tensor code (the ``"uniform"`` and ``"random"`` couplings).
    """

    #: the layer's couplings when a call names none (one of :data:`COUPLINGS`; set by the registry's ``build``)
    couplings: str = "routed"

    def route(
        self,
        poses: torch.Tensor,
        activations: torch.Tensor | None = None,
        *,
        iterations: int | None = None,
        return_routing: bool = False,
        couplings: str | None = None,
    ) -> Routed:
        """Route ``n_inp`` input capsules to the layer's ``n_out`` output capsules.

        Parameters
        ----------
        poses : torch.Tensor
            ``[B, n_inp, d_inp]``, the input capsules (a matrix capsule flattened, ``P x P -> P*P``).
        activations : torch.Tensor or None, optional
            ``[B, n_inp]``, the input activations on the scale the algorithm's registry entry names
            (:attr:`~capsule_lib.routing.kinds.RoutingKind.activations`: probabilities or logits); ``None`` (default)
            for an algorithm that takes none. A layer refuses what its algorithm does not take and asks for what it
            needs, in one line.
        iterations : int or None, optional
            Routing iterations for this call, >= 1; ``None`` (default): the layer's. An algorithm that does not
            iterate refuses a number.
        return_routing : bool, optional
            Also record the :class:`~capsule_lib.types.RoutingTrace` (default False).
        couplings : str or None, optional
            ``"routed"``: the algorithm's couplings; ``"uniform"``: every coupling ``1 / n_out``; ``"random"``: each
            child's couplings drawn uniformly in ``(0, 1)`` (torch's generator) and divided by their sum; both in one
            pass, with nothing else of the algorithm changed (for an iterative algorithm ``"uniform"`` is its first
            iteration; for self-attention routing it replaces the softmax of the agreements, the log prior stays).
            ``None`` (default): the layer's :attr:`couplings`.

        Returns
        -------
        Routed
            ``poses [B, n_out, d_out]``, ``activations [B, n_out]`` on the scale of the entry's ``scores`` (``None``
            for an algorithm whose outputs have none), and the trace (``None`` without ``return_routing``; with fixed
            couplings a one-pass trace of them, the outputs and activations).
        """
        mode = check_choice(self.couplings if couplings is None else couplings, COUPLINGS, "couplings")
        self._check_route_input(poses, activations, mode)
        if mode == "routed":
            return self._routed(poses, activations, iterations, return_routing)
        if iterations is not None:
            raise ValueError(f"couplings={mode!r} route in one pass: pass iterations=None")
        n_out = getattr(self, "n_out", -1)
        if n_out < 1:
            raise ValueError(f"couplings={mode!r} need a layer with a fixed n_out, got n_out={n_out}")
        R = fixed_couplings(mode, poses.shape[0], poses.shape[1], n_out, poses)  # [B, n_inp, n_out]
        routed = self._coupled(poses, activations, R)
        if not return_routing:
            return routed
        acts = [] if routed.activations is None else [routed.activations]
        name = getattr(self, "algorithm", type(self).__name__)
        trace = RoutingTrace(name, coefficients=[R], outputs=[routed.poses], activations=acts)
        trace.extra["couplings"] = mode
        return routed._replace(trace=trace)

    def _input_width(self) -> int | None:
        """The size of one input capsule this layer takes (``d_inp``, or ``pose_dim``; a matrix capsule's ``P * P``
        entries where the layer names its poses otherwise), checked by :meth:`route` before anything runs."""
        return getattr(self, "d_inp", None) or getattr(self, "pose_dim", None)

    def _check_route_input(self, poses: Any, activations: Any, mode: str) -> None:
        """What every routing checks first, in one line each, whatever its couplings: ``poses`` a non-empty float tensor
        ``[B, n_inp, d]`` of the layer's sizes (a fully connected layer; a layer built for any ``n_inp`` takes any),
        ``activations`` ``None`` or ``[B, n_inp]`` with no NaN."""
        n_inp, d = getattr(self, "n_inp", -1), self._input_width()
        sizes = [n_inp if isinstance(n_inp, int) and n_inp > 0 else None, d]
        spec = f"[B, n_inp={sizes[0] or '*'}, d={d or '*'}]"
        if mode == "routed":  # (the Heinsen layers route any leading dimensions; the others check theirs)
            check_tensor(poses, "poses", spec, sizes, min_leading=0)
        else:
            check_tensor(poses, "poses", spec, [None, *sizes])
        check_nonempty(poses, "poses", spec, leading=max(1, poses.dim() - 2))
        if activations is None:
            return
        check_tensor(activations, "activations", f"[B, n_inp={poses.shape[-2]}]", [poses.shape[-2]], min_leading=0)
        if activations.shape != poses.shape[:-1]:
            raise ValueError(
                f"activations: expected shape {tuple(poses.shape[:-1])} (one per input capsule of the poses "
                f"{tuple(poses.shape)}), got {tuple(activations.shape)}"
            )
        check_no_nan(activations, "activations")


def fixed_couplings(mode: str, batch: int, n_inp: int, n_out: int, like: torch.Tensor) -> torch.Tensor:
    """Couplings that no agreement chose, ``[batch, n_inp, n_out]``, summing to 1 over the parents (the last axis).

    Parameters
    ----------
    mode : str
        ``"uniform"``: every coupling ``1 / n_out``; ``"random"``: uniform draws in ``(0, 1)`` divided by each
        child's sum (a fresh draw per call, from torch's generator on ``like``'s device).
    batch, n_inp, n_out : int
        The shape.
    like : torch.Tensor
        Gives the device and the floating dtype (float32 for half precision).

    Returns
    -------
    torch.Tensor
        ``[batch, n_inp, n_out]``.
    """
    check_choice(mode, COUPLINGS[1:], "fixed couplings")
    dtype = torch.promote_types(like.dtype, torch.float32)
    if mode == "uniform":
        return torch.full((batch, n_inp, n_out), 1.0 / n_out, dtype=dtype, device=like.device)
    draw = torch.rand(batch, n_inp, n_out, dtype=dtype, device=like.device).clamp_min_(torch.finfo(dtype).tiny)
    return draw / draw.sum(-1, keepdim=True)


def fields_repr(module: torch.nn.Module, *names: str) -> str:
    """``"name=value, ..."`` (values by ``repr``) of the named attributes: a routing module's ``extra_repr``."""
    return ", ".join(f"{name}={getattr(module, name)!r}" for name in names)


def autocast_outputs(result: Any, device_type: str) -> Any:
    """Under ``torch.autocast`` every routing layer returns its outputs in the autocast dtype (as the matmul
    that makes its votes would), whatever precision its internals use; a trace, if present, is left as is
    (its tensors stay in the precision they were computed in). Outside autocast ``result`` is unchanged.

    Parameters
    ----------
    result : torch.Tensor or tuple
        A tensor, a (nested) tuple of tensors, or ``(outputs, RoutingTrace)`` from ``return_routing=True``.
    device_type : str
        The device type whose autocast state is read (``"cpu"``, ``"cuda"``, ...).

    Returns
    -------
    torch.Tensor or tuple
        ``result`` with every floating-point tensor that is not float64 cast to the autocast dtype (tuples
        recursively, a :class:`RoutingTrace` untouched); ``result`` itself outside autocast.
    """
    if not torch.is_autocast_enabled(device_type):
        return result
    dtype = torch.get_autocast_dtype(device_type)

    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
            return x.to(dtype)
        if isinstance(x, tuple) and not isinstance(x, RoutingTrace):
            return tuple(cast(t) for t in x)
        return x

    return cast(result)


#: Devices on which the hand-written fused and blocked kernels (``_CapsuleVotes``, ``_FusedRouting``,
#: ``_EMRoutingFunction``, ``_AttendMatrix``, ``_FusedSelfAttention``, Heinsen's moments path) were measured faster
#: than their plain paths (``benchmarks/bench.py``): the CPU only. They walk cache-sized blocks with many small
#: operations, which on a GPU become as many kernel launches (the blocked EM routing: ~34,000 CUDA kernels per
#: training step on an H200, 340 ms against 16 ms for the plain path), so on CUDA (and MPS) every routing takes its
#: vectorised plain path, whose number of operations per iteration does not grow with the number of capsules.
KERNEL_DEVICES: tuple[str, ...] = ("cpu",)


def kernel_device(t: torch.Tensor) -> bool:
    """Whether ``t``'s device is one where the fused kernels are used (:data:`KERNEL_DEVICES`).

    Parameters
    ----------
    t : torch.Tensor
        Any tensor; only its device type is read.

    Returns
    -------
    bool
        True if ``t.device.type`` is in :data:`KERNEL_DEVICES`.
    """
    return t.device.type in KERNEL_DEVICES


def use_kernel(
    *tensors: torch.Tensor,
    trace: bool = False,
    dtypes: tuple[torch.dtype, ...] | None = (torch.float32, torch.float64),
    autocast: bool = False,
    compiling: bool = False,
) -> bool:
    """The one rule by which a routing replaces its plain path with a hand-written kernel. A kernel is used only

    * on a device of :data:`KERNEL_DEVICES` (the CPU; measured there, and slower on a GPU);
    * without a trace (``return_routing=True``: the trace's tensors come from the plain path);
    * not while ``torch.compile`` traces (it compiles the plain path and fuses it itself) unless ``compiling`` (the
      kernel is plain differentiable tensor code, which ``torch.compile`` traces like the plain path);
    * with every tensor of one dtype in ``dtypes`` (``None``: any; the kernel upcasts itself);
    * outside autocast on that device unless ``autocast`` (the kernel handles autocast itself); otherwise the plain
      path's products would run in half precision and the kernel's not.

    The algorithm module calls it and picks its kernel (``routing/<algorithm>.py``); the kernels in ``_kernels/``
    never choose themselves. Each kernel is tested equal to its plain path in float64 (values and gradients,
    mixed-scale inputs: ``tests/test_fused_kernels.py``).

    Parameters
    ----------
    \\*tensors : torch.Tensor
        The kernel's tensor inputs (at least one); the first one's device and dtype decide.
    trace : bool, optional
        Whether a trace is asked for (``return_routing=True``); True refuses the kernel (default False). A kernel
        that returns the trace's tensors itself (inverted attention's ``_AttendMatrix``: ``r`` and ``a``) passes
        False.
    dtypes : tuple[torch.dtype, ...] or None, optional
        The dtypes the kernel accepts, all tensors sharing one (default float32 and float64); ``None``: any.
    autocast : bool, optional
        Whether the kernel handles autocast itself (default False: refused while autocast is on).
    compiling : bool, optional
        Whether the kernel may run while ``torch.compile`` traces, being plain tensor code without a custom autograd
        function (default False: refused while compiling; Heinsen's moments path passes True).

    Returns
    -------
    bool
        True if the kernel may replace the plain path.
    """
    t0 = tensors[0]
    if trace or (not compiling and torch.compiler.is_compiling()) or not kernel_device(t0):
        return False
    if not autocast and torch.is_autocast_enabled(t0.device.type):
        return False
    return dtypes is None or (t0.dtype in dtypes and all(t.dtype == t0.dtype for t in tensors))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a routing computes in: float16/bfloat16/float32 -> float32; float64 -> float64.

    Parameters
    ----------
    dtype : torch.dtype
        The inputs' dtype.

    Returns
    -------
    torch.dtype
        ``torch.promote_types(dtype, torch.float32)``.
    """
    return torch.promote_types(dtype, torch.float32)


def no_autocast(t: torch.Tensor):
    """Context that turns autocast off on ``t``'s device (so einsums really run in the compute dtype).

    Parameters
    ----------
    t : torch.Tensor
        Any tensor; autocast is turned off on its device type.

    Returns
    -------
    torch.autocast
        A context manager, ``torch.autocast(device_type=t.device.type, enabled=False)``.
    """
    return torch.autocast(device_type=t.device.type, enabled=False)


def check_one_or(p: torch.Tensor, name: str, spec: str, n: int, rest: list) -> None:
    """``p`` must be ``[n, *rest]`` or ``[1, *rest]`` (weights shared across inputs); ValueError otherwise.

    Parameters
    ----------
    p : torch.Tensor
        The parameter to check.
    name : str
        Its name in the error message.
    spec : str
        Its expected shape as written in the error message, e.g. ``"[n_inp=8 or 1, n_out]"``.
    n : int
        The allowed first size besides 1 (the number of inputs).
    rest : list
        The expected sizes after the first (``None`` for any size).
    """
    check_tensor(p, name, spec, [None, *rest])
    if p.shape[0] not in (1, n):
        raise ValueError(f"{name}: expected shape {spec} with first size 1 or {n}, got {tuple(p.shape)}")


def refuse_activations(activations: torch.Tensor | None, layer: torch.nn.Module) -> None:
    """The routing protocol's check for a layer whose algorithm takes no input activations: ValueError if given.

    Parameters
    ----------
    activations : torch.Tensor or None
        What the caller passed as ``activations``.
    layer : torch.nn.Module
        The routing layer (named in the message).
    """
    if activations is not None:
        raise ValueError(f"{type(layer).__name__} takes no input activations (pass activations=None)")


def require_activations(activations: torch.Tensor | None, layer: torch.nn.Module, scale: str) -> torch.Tensor:
    """The routing protocol's check for a layer whose algorithm needs input activations: ValueError if missing.

    Parameters
    ----------
    activations : torch.Tensor or None
        What the caller passed as ``activations``.
    layer : torch.nn.Module
        The routing layer (named in the message).
    scale : str
        The activations' scale, for the message (``"probabilities in [0, 1]"``, ``"logits"``).

    Returns
    -------
    torch.Tensor
        ``activations``.
    """
    if activations is None:
        raise ValueError(f"{type(layer).__name__} needs input activations ([B, n_inp] {scale})")
    return activations


def split_trace(out: Any, return_routing: bool) -> tuple[Any, RoutingTrace | None]:
    """``(result, trace)`` of a layer's call: ``out`` itself with ``return_routing``, else ``(out, None)``."""
    return out if return_routing else (out, None)
