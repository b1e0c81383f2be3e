"""Heinsen (2019), "An Algorithm for Routing Capsules in All Domains": the smallNORB classifier and the
sequence (SST) classification head, both built from :class:`~capsule_lib.routing.heinsen_2019.GenerativeMatrixRouting`.

smallNORB (the default :class:`SmallNORBConfig`, 271,688 parameters)::

    images       [B, 2, 96, 96]        L and R camera images, pixels in [0, 1]
    + coords     [B, 4, 96, 96]        two coordinate channels, linspace(-1, 1) along H and along W
    6 x [BN -> Conv3x3 (no padding) -> Swish], strides 1,2,1,2,1,2:  96 -> 94 -> 46 -> 44 -> 21 -> 19 -> 9
    a            [B, 5184]             BN -> Conv1x1(64 -> 64); part-major, then (y, x)
    mu           [B, 5184, 4, 4]       BN -> Conv1x1(64 -> 1024) -> [B, 64, 4, 4, 9, 9] -> [B, 64, 9, 9, 4, 4]
    routing 1    [B, 64], [B, 64, 4, 4]        variable n_inp: W [1, 64, 4, 4] shared by all 5184 inputs
    routing 2    [B, 5], [B, 5, 4, 4]          n_inp = 64

Input preprocessing expected by :class:`SmallNORBClassifier`: the stereo pair stacked as 2 channels at the
native 96 x 96 resolution (no resizing or standardisation: the first BatchNorm does that), pixels in [0, 1]
(``uint8 / 255``). The paper augments with a random +-16 px shift with edge fill (``RandomCrop(96, padding=16,
padding_mode='edge')``); test images are not cropped.

The model adds the coordinate channels; if the pipeline did (``heinsen_transform(..., coords=True)``: ``[B, 4, 96,
96]``), build it with ``SmallNORBConfig(in_channels=4, coord_channels=False)``: the same network and outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .._checks import check_images, check_model_input, check_nonempty, check_tensor, resolve_config
from .._contracts import check_fields, checked
from ..functional import add_coordinate_channels
from ..routing.heinsen_2019 import GenerativeMatrixRouting
from ..types import CapsuleOutput, ImageContract

__all__ = [
    "SmallNORBConfig",
    "SmallNORBClassifier",
    "SequenceClassifierConfig",
    "SequenceClassifierHead",
    "TokenSequenceConfig",
    "TokenSequenceClassifier",
    "chain_credits",
    "bang_per_bit",
]


def chain_credits(part_trace, class_trace, iteration: int = -1) -> torch.Tensor:
    """How much of each input of a two-routing model each class capsule uses: ``[..., n_inp, n_classes]``.

    ``credit_ik = sum_j D_use_ij R_jk``: input ``i``'s data used by part ``j`` in the first routing's last
    iteration (``D_use = sigmoid(a_i) R_ij``) times part ``j``'s share ``R_jk`` of class ``k`` in iteration
    ``iteration`` of the second routing. Summed over the classes it is ``sigmoid(a_i)`` (all the data that
    input ``i`` has), so each input's credits say how its data is divided among the classes.

    Parameters
    ----------
    part_trace : RoutingTrace
        Trace of the first routing (inputs -> parts), with ``extra["D_use"]``.
    class_trace : RoutingTrace
        Trace of the second routing (parts -> classes).
    iteration : int, optional
        Iteration of the second routing whose coefficients are used (default -1, the last).

    Returns
    -------
    torch.Tensor
        ``[..., n_inp, n_classes]`` credits.
    """
    d_use = part_trace.extra["D_use"][-1]  # [..., I, J]
    r_cls = class_trace.coefficients[iteration]  # [..., J, K]
    return torch.einsum("...ij,...jk->...ik", d_use, r_cls.to(d_use.dtype))  # [..., I, K]


def bang_per_bit(routing: GenerativeMatrixRouting, trace, iteration: int = -1) -> torch.Tensor:
    """``phi_ij = beta_use_ij D_use_ij - beta_ign_ij D_ign_ij`` of one routing call at ``iteration``: input ``i``'s
    contribution to output ``j``'s logit (``a_out_j = sum_i phi_ij``), what Heinsen (2022) chains across routings.

    Parameters
    ----------
    routing : GenerativeMatrixRouting
        The routing layer that made ``trace`` (its ``beta_use``, ``beta_ign``).
    trace : RoutingTrace
        Trace of one call (``return_routing=True``), with ``extra["D_use"]`` and ``extra["D_ign"]``.
    iteration : int, optional
        Iteration of that call (default -1, the last).

    Returns
    -------
    torch.Tensor
        ``[..., n_inp, n_out]`` contributions ``phi_ij``.
    """
    d_use, d_ign = trace.extra["D_use"][iteration], trace.extra["D_ign"][iteration]  # [..., I, J]
    I, J = d_use.shape[-2:]
    _, _, b_use, b_ign = routing.expanded_parameters(J, I)
    return b_use.to(d_use.dtype) * d_use - b_ign.to(d_use.dtype) * d_ign  # [..., I, J]


# -------------------------------------------------------------------------------------------- smallNORB
@dataclass
class SmallNORBConfig:
    """Hyper-parameters of the paper's smallNORB model (the defaults).

    Attributes
    ----------
    n_objs : int
        Object classes, the class capsules (default 5).
    n_parts : int
        Part capsule types per position, and parts after routing 1 (default 64).
    d_chns : int
        Channels of the conv stack (default 64).
    in_channels : int
        Image channels: the L and R images (default 2; 4 if the data pipeline already added the coordinates).
    image_size : int or None
        Checked on input (default 96); ``None`` accepts any size (routing 1 takes any ``n_inp``).
    d_pose : int
        Capsules are ``d_pose x d_pose`` matrices (default 4).
    iterations : int
        Iterations of both routings, >= 1 (default 3).
    strides : tuple of int
        Strides of the 3x3 convolutions, one each (default ``(1, 2, 1, 2, 1, 2)``: six).
    coord_channels : bool
        Add the two coordinate channels inside the model (default ``True``; ``False``: the input has them).
    """

    n_objs: int = 5
    n_parts: int = 64
    d_chns: int = 64
    in_channels: int = 2
    image_size: int | None = 96
    d_pose: int = 4
    iterations: int = 3
    strides: tuple[int, ...] = (1, 2, 1, 2, 1, 2)
    coord_channels: bool = True

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)


class SmallNORBClassifier(nn.Module):
    """Heinsen's (2019) smallNORB classifier (99.1% test accuracy in the paper; 271,688 parameters).

    Module names follow the original code (``convolve``, ``compute_a``, ``compute_mu``, ``routings``), so the
    published state_dict loads. As in the original code, the six 3x3 convolutions get Kaiming-normal
    weights and zero biases; the 1x1 heads keep PyTorch's default init.

    Parameters
    ----------
    config : SmallNORBConfig, optional
        The hyper-parameters; ``None`` (default) for ``SmallNORBConfig()``, the paper's model.
    overrides
        Keyword arguments: fields of the config to replace (e.g. ``coord_channels=False``).
    """

    @checked
    def __init__(self, config: SmallNORBConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = resolve_config(config, SmallNORBConfig, overrides)
        self.config = cfg
        chans_in = [cfg.in_channels + (2 if cfg.coord_channels else 0)] + [cfg.d_chns] * (len(cfg.strides) - 1)
        layers: list[nn.Module] = []
        for c_in, stride in zip(chans_in, cfg.strides):
            layers += [nn.BatchNorm2d(c_in), nn.Conv2d(c_in, cfg.d_chns, 3, stride), nn.SiLU()]  # SiLU = Swish
        self.convolve = nn.Sequential(*layers)
        self.compute_a = nn.Sequential(nn.BatchNorm2d(cfg.d_chns), nn.Conv2d(cfg.d_chns, cfg.n_parts, 1))
        self.compute_mu = nn.Sequential(
            nn.BatchNorm2d(cfg.d_chns), nn.Conv2d(cfg.d_chns, cfg.n_parts * cfg.d_pose**2, 1)
        )
        p = cfg.d_pose
        self.routings = nn.ModuleList(
            [
                GenerativeMatrixRouting(d_cov=p, d_inp=p, d_out=p, n_out=cfg.n_parts, iterations=cfg.iterations),
                GenerativeMatrixRouting(
                    d_cov=p, d_inp=p, d_out=p, n_inp=cfg.n_parts, n_out=cfg.n_objs, iterations=cfg.iterations
                ),
            ]
        )
        for m in self.convolve:
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight)
                nn.init.zeros_(m.bias)

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` (any size when ``image_size`` is ``None``) in [0, 1]
        (``predict`` converts uint8)."""
        return ImageContract(self.config.in_channels, self.config.image_size)

    def part_capsules(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The part capsules of images, part-major, then ``(y, x)``.

        Parameters
        ----------
        images : torch.Tensor
            As in :meth:`forward` (checked here too).

        Returns
        -------
        tuple of torch.Tensor
            ``(a [B, n_parts * h * w], mu [B, n_parts * h * w, d_pose, d_pose])``: activation logits and poses.
        """
        c = self.config
        check_images(images, self.input_contract, f"{type(self).__name__}: images")
        x = add_coordinate_channels(images) if c.coord_channels else images  # [B, 4, 96, 96]
        x = self.convolve(x)  # [B, 64, 9, 9]
        Bsz, _, h, w = x.shape
        a = self.compute_a(x).reshape(Bsz, c.n_parts * h * w)  # [B, 5184]
        mu = self.compute_mu(x).reshape(Bsz, c.n_parts, c.d_pose, c.d_pose, h, w)  # [B, 64, 4, 4, 9, 9]
        mu = mu.permute(0, 1, 4, 5, 2, 3).reshape(Bsz, c.n_parts * h * w, c.d_pose, c.d_pose)  # [B, 5184, 4, 4]
        return a, mu

    def forward(
        self, images: torch.Tensor, return_routing: bool = False, iterations: int | None = None
    ) -> CapsuleOutput:
        """Images -> class capsules (logits).

        Parameters
        ----------
        images : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1] (``[B, 2, 96, 96]`` by default).
        return_routing : bool, optional
            Also record both routings' traces (default ``False``).
        iterations : int, optional
            Iterations of both routings for this call, >= 1; ``None`` (default) uses the config's.

        Returns
        -------
        CapsuleOutput
            ``scores [B, n_objs]``: the class routing's ``a_out``, **logits for a (soft-target) cross-entropy**
            (``kind="logits"``), not capsule lengths. ``poses [B, n_objs, 16]``: the class capsules ``mu_out`` (4 x 4
            pose matrices, flattened). ``extra``: ``"mu"``, ``"sigma2"`` ``[B, n_objs, 4, 4]`` (their variances),
            and with ``return_routing`` ``"traces"`` = ``[parts trace, class trace]``; ``trace``: the class routing's.
        """
        check_model_input(images, self, "images")
        a, mu = self.part_capsules(images)
        traces, T = [], {} if iterations is None else {"iterations": iterations}
        for routing in self.routings:
            if return_routing:
                (a, mu, sigma2), tr = routing(a, mu, return_routing=True, **T)
                traces.append(tr)
            else:
                a, mu, sigma2 = routing(a, mu, **T)  # [B, J], [B, J, 4, 4], [B, J, 4, 4]
        extra = {"mu": mu, "sigma2": sigma2}
        if return_routing:
            extra["traces"] = traces
        return CapsuleOutput(a, "logits", mu.flatten(-2), None, traces[-1] if traces else None, extra)

    def part_grid(self, images: torch.Tensor) -> tuple[int, int]:
        """The grid of part-capsule positions the convolutions leave for these images.

        Parameters
        ----------
        images : torch.Tensor
            ``[..., H, W]`` images (only their size is read).

        Returns
        -------
        tuple of int
            ``(h, w)`` (``(9, 9)`` for 96 x 96 images).
        """
        h, w = images.shape[-2:]
        for s in self.config.strides:
            h, w = (h - 3) // s + 1, (w - 3) // s + 1
        return h, w

    def class_credits(self, images: torch.Tensor, iteration: int = -1) -> tuple[CapsuleOutput, torch.Tensor]:
        """Which part capsules each class capsule explains, as maps over the grid of positions.

        Parameters
        ----------
        images : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1].
        iteration : int, optional
            Iteration of the class routing (default -1, the last).

        Returns
        -------
        tuple
            ``(out, credits)``: the forward pass (traces included) and ``[B, n_objs, n_parts, h, w]`` credits,
            :func:`chain_credits` of the two routings per part type and position (summed over part types: a map).
        """
        out = self(images, return_routing=True)
        c = self.config
        h, w = self.part_grid(images)
        credits = chain_credits(*out.extra["traces"], iteration)  # [B, n_parts * h * w, n_objs]
        credits = credits.reshape(images.shape[0], c.n_parts, h, w, c.n_objs).permute(0, 4, 1, 2, 3)
        return out, credits  # [B, n_objs, n_parts, h, w]


# --------------------------------------------------------------------------- sequence classification
@dataclass
class SequenceClassifierConfig:
    """The paper's SST head (defaults: SST-5 on the 37 hidden states of GPT-2-large).

    Attributes
    ----------
    d_depth : int or None
        Embeddings per token, transformer layers incl. the input embeddings (default 37); ``None`` takes one
        embedding per token ``[B, n, d_emb]`` and has no depth embedding.
    d_emb : int
        Size of each embedding (default 1280).
    d_inp : int
        Features computed per embedding, the input capsules' size (default 64).
    d_out : int
        Output capsules are ``1 x d_out`` (default 2).
    n_parts : int
        Capsules after the first routing (default 64).
    n_classes : int
        Classes (default 5; 2 for SST-2).
    iterations : int
        Iterations of both routings, >= 1 (default 3).
    """

    d_depth: int | None = 37
    d_emb: int = 1280
    d_inp: int = 64
    d_out: int = 2
    n_parts: int = 64
    n_classes: int = 5
    iterations: int = 3

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)


class SequenceClassifierHead(nn.Module):
    """Heinsen's (2019) sequence classifier head over variable-length token capsules (the SST model, without
    the frozen transformer): 140,480 trainable parameters for SST-5, 138,944 for SST-2.

    An empty sequence axis (``n = 0``) raises ``ValueError``. A sequence of padding only is defined: no input
    has any data (``sigmoid(-inf) = 0``), so the parts are empty (``mu = 0``, scores ``0``) and the class
    scores are what the trained head gives to "no evidence", finite and independent of the padded embeddings.

    Pipeline: ``embs + depth_emb`` -> Linear(d_emb -> d_inp, Kaiming) -> Swish -> LayerNorm(d_inp) gives
    ``n * d_depth`` input capsules ``[B, n * d_depth, 1, d_inp]`` with scores ``a`` repeated over depth ->
    Routing(1, d_inp, d_out, n_out=n_parts, variable n_inp) -> Routing(1, d_out, d_out, n_inp=n_parts,
    n_out=n_classes). Module names (``depth_emb``, ``detect_parts``, ``routings``) follow the original
    ``SSTClassifier``.

    Parameters
    ----------
    config, overrides
        A :class:`SequenceClassifierConfig` (``None``, the default: the paper's SST-5 head) and keyword arguments
        that replace its fields.
    """

    def __init__(self, config: SequenceClassifierConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = resolve_config(config, SequenceClassifierConfig, overrides)
        self.config = cfg
        self.depth_emb = nn.Parameter(torch.zeros(cfg.d_depth, cfg.d_emb)) if cfg.d_depth else None
        self.detect_parts = nn.Sequential(nn.Linear(cfg.d_emb, cfg.d_inp), nn.SiLU(), nn.LayerNorm(cfg.d_inp))
        self.routings = nn.ModuleList(
            [
                GenerativeMatrixRouting(
                    d_cov=1, d_inp=cfg.d_inp, d_out=cfg.d_out, n_out=cfg.n_parts, iterations=cfg.iterations
                ),
                GenerativeMatrixRouting(
                    d_cov=1,
                    d_inp=cfg.d_out,
                    d_out=cfg.d_out,
                    n_inp=cfg.n_parts,
                    n_out=cfg.n_classes,
                    iterations=cfg.iterations,
                ),
            ]
        )
        nn.init.kaiming_normal_(self.detect_parts[0].weight)
        nn.init.zeros_(self.detect_parts[0].bias)

    def input_scores(
        self, embs: torch.Tensor, padding_mask: torch.Tensor | None, token_weights: torch.Tensor | None
    ) -> torch.Tensor:
        """Token score logits: +inf for tokens, -inf for padding (or ``logit(token_weights)``).

        Parameters
        ----------
        embs : torch.Tensor
            ``[B, n, ...]`` embeddings (only ``B`` and ``n`` are read).
        padding_mask : torch.Tensor or None
            Bool ``[B, n]``, True = padding.
        token_weights : torch.Tensor or None
            Float ``[B, n]`` in [0, 1], 1 = token; not together with ``padding_mask`` (``ValueError``).

        Returns
        -------
        torch.Tensor
            ``[B, n]`` score logits (+inf everywhere when both are ``None``).
        """
        Bsz, n = embs.shape[:2]
        if padding_mask is not None and token_weights is not None:
            raise ValueError("pass either padding_mask or token_weights, not both")
        if padding_mask is not None:
            if (
                not isinstance(padding_mask, torch.Tensor)
                or padding_mask.dtype != torch.bool
                or padding_mask.shape != (Bsz, n)
            ):
                got = tuple(padding_mask.shape) if isinstance(padding_mask, torch.Tensor) else type(padding_mask)
                raise ValueError(f"padding_mask: expected a bool tensor of shape [B, n] = {(Bsz, n)}, got {got}")
            inf = torch.full((), float("inf"), device=embs.device)
            return torch.where(padding_mask, -inf, inf)  # [B, n]
        if token_weights is not None:
            check_tensor(token_weights, "token_weights", f"[B, n] = {(Bsz, n)}", [Bsz, n])
            return torch.logit(token_weights.float())  # [B, n]
        return torch.full((Bsz, n), float("inf"), device=embs.device)

    def forward(
        self,
        embs: torch.Tensor,
        padding_mask: torch.Tensor | None = None,
        *,
        token_weights: torch.Tensor | None = None,
        return_routing: bool = False,
    ) -> CapsuleOutput:
        """Token capsules -> class capsules (logits).

        Parameters
        ----------
        embs : torch.Tensor
            ``[B, n, d_depth, d_emb]`` (all hidden states of every token), or ``[B, n, d_emb]`` when
            ``config.d_depth is None``; ``n >= 1``.
        padding_mask : torch.Tensor, optional
            Bool ``[B, n]``, **True = padding** (ignored). ``None`` (default): no mask.
        token_weights : torch.Tensor, optional
            Instead of ``padding_mask``: float ``[B, n]`` in [0, 1], 1 = token, as in the original code (mixup mixes
            these); score ``a = logit(w)`` (``+-inf`` for exact 0/1). Without either, every position is a token.
        return_routing : bool, optional
            Also record both routings' traces (default ``False``).

        Returns
        -------
        CapsuleOutput
            ``scores`` = class **logits** ``[B, n_classes]`` (``kind="logits"``), ``poses [B, n_classes, d_out]``,
            ``extra["sigma2"]``; with ``return_routing``, the class routing's trace (``extra["traces"]``: both).
        """
        c = self.config
        if c.d_depth:
            check_tensor(
                embs, "embs", f"[B, n, d_depth={c.d_depth}, d_emb={c.d_emb}]", [None, None, c.d_depth, c.d_emb]
            )
        else:
            check_tensor(embs, "embs", f"[B, n, d_emb={c.d_emb}]", [None, None, c.d_emb])
            embs = embs.unsqueeze(-2)  # [B, n, 1, d_emb]
        check_nonempty(embs, "embs", "[B, n, d_depth, d_emb]")
        Bsz, n, depth = embs.shape[:3]
        if n == 0:
            raise ValueError(
                f"embs: the sequences are empty ({tuple(embs.shape)}, n = 0); pass at least one position "
                "(a sequence of padding only is allowed: mask it with padding_mask)"
            )
        a = self.input_scores(embs, padding_mask, token_weights)  # [B, n]
        a = a.unsqueeze(-1).expand(Bsz, n, depth).reshape(Bsz, n * depth)  # [B, n * depth]
        x = embs + self.depth_emb if self.depth_emb is not None else embs  # [B, n, depth, d_emb]
        mu = self.detect_parts(x).reshape(Bsz, n * depth, 1, c.d_inp)  # [B, n * depth, 1, d_inp]
        traces = []
        for routing in self.routings:
            if return_routing:
                (a, mu, sigma2), tr = routing(a, mu, return_routing=True)
                traces.append(tr)
            else:
                a, mu, sigma2 = routing(a, mu)  # [B, J], [B, J, 1, d_out], [B, J, 1, d_out]
        extra = {"sigma2": sigma2.flatten(-2)}
        if return_routing:
            extra["traces"] = traces
        return CapsuleOutput(a, "logits", mu.flatten(-2), None, traces[-1] if traces else None, extra)


# ------------------------------------------------------------------ token sequences (generated task)
@dataclass
class TokenSequenceConfig:
    """A token-embedding table in front of :class:`SequenceClassifierHead` (one embedding per token, no depth
    embedding): the Heinsen chapter's model for :func:`~capsule_lib.data.sequences.marker_sequences` (defaults).

    Attributes
    ----------
    vocab : int
        Vocabulary size, token ids in ``[0, vocab)`` with 0 = padding (default 32).
    d_emb : int
        Size of the token embeddings (default 32).
    d_inp : int
        Features computed per token embedding, the input capsules' size (default 16).
    d_out : int
        Output capsules are ``1 x d_out`` (default 2).
    n_parts : int
        Capsules after the first routing (default 16).
    n_classes : int
        Classes (default 4).
    iterations : int
        Iterations of both routings, >= 1 (default 3).
    """

    vocab: int = 32
    d_emb: int = 32
    d_inp: int = 16
    d_out: int = 2
    n_parts: int = 16
    n_classes: int = 4
    iterations: int = 3

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)


class TokenSequenceClassifier(nn.Module):
    """``tokens [B, n]`` (int64, ``0`` = padding) -> :class:`CapsuleOutput` of class logits: an
    ``nn.Embedding`` then Heinsen's routing head over the ``n`` token capsules, which routes from any ``n``
    (padding masked out).

    Parameters
    ----------
    config, overrides
        A :class:`TokenSequenceConfig` (default ``None``: ``TokenSequenceConfig()``) and fields of it to replace,
        as keyword arguments.
    """

    def __init__(self, config: TokenSequenceConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = resolve_config(config, TokenSequenceConfig, overrides)
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_emb, padding_idx=0)
        self.head = SequenceClassifierHead(
            SequenceClassifierConfig(
                d_depth=None,
                d_emb=cfg.d_emb,
                d_inp=cfg.d_inp,
                d_out=cfg.d_out,
                n_parts=cfg.n_parts,
                n_classes=cfg.n_classes,
                iterations=cfg.iterations,
            )
        )

    def forward(self, tokens: torch.Tensor, return_routing: bool = False) -> CapsuleOutput:
        """Token ids -> class capsules (logits).

        Parameters
        ----------
        tokens : torch.Tensor
            int64 ``[B, n]`` token ids in ``[0, vocab)``, 0 = padding.
        return_routing : bool, optional
            Also record both routings' traces (default ``False``).

        Returns
        -------
        CapsuleOutput
            As :meth:`SequenceClassifierHead.forward`: class logits ``[B, n_classes]``, ``poses [B, n_classes, d_out]``.
        """
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            got = f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, torch.Tensor) else type(tokens).__name__
            raise ValueError(f"tokens: expected an int64 tensor [B, n] of token ids (0 = padding), got {got}")
        if tokens.numel() and (tokens.min() < 0 or tokens.max() >= self.config.vocab):
            raise ValueError(
                f"tokens: ids must be in [0, {self.config.vocab}), got {int(tokens.min())}..{int(tokens.max())}"
            )
        return self.head(self.embed(tokens), tokens == 0, return_routing=return_routing)

    def token_credits(self, tokens: torch.Tensor) -> tuple[CapsuleOutput, torch.Tensor]:
        """Each token's credit for each class logit, Heinsen's (2022) chained "bang per bit"
        ``credit_ik = sum_j phi1_ij phi2_jk`` (:func:`bang_per_bit` of the two routings' last iterations).

        Parameters
        ----------
        tokens : torch.Tensor
            Token ids, as in :meth:`forward`.

        Returns
        -------
        tuple
            ``(out, credits)``: the forward pass (traces included) and ``[B, n, n_classes]`` credits: positive =
            the token speaks for class ``k``, negative = against it, 0 for padding.
        """
        out = self(tokens, return_routing=True)
        t1, t2 = out.extra["traces"]
        phi1 = bang_per_bit(self.head.routings[0], t1)  # [B, n, J]
        phi2 = bang_per_bit(self.head.routings[1], t2)  # [B, J, K]
        return out, torch.einsum("bij,bjk->bik", phi1, phi2)  # [B, n, K]

    @torch.no_grad()
    def token_occlusion(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """How much each class logit drops when token ``t`` alone is masked out (turned into padding, which the
        routing ignores exactly); no gradients.

        Parameters
        ----------
        tokens : torch.Tensor
            int64 ``[B, n]`` token ids, 0 = padding.

        Returns
        -------
        tuple of torch.Tensor
            ``(scores [B, K], effect [B, n, K])``: the class logits of ``tokens`` and ``effect[b, t] = scores[b] -
            scores(tokens[b] without t)``, 0 at padding; positive = the token spoke for the class.
        """
        Bsz, n = tokens.shape
        scores = self(tokens).scores  # [B, K]
        masked = tokens[:, None, :].repeat(1, n, 1)  # [B, n (masked position), n]
        masked[:, torch.arange(n), torch.arange(n)] = 0
        drop = scores[:, None, :] - self(masked.reshape(Bsz * n, n)).scores.reshape(Bsz, n, -1)  # [B, n, K]
        return scores, drop.masked_fill((tokens == 0)[..., None], 0.0)
