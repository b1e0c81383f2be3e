"""The ray caster behind the rendered smallNORB-like set (:mod:`capsule_lib.data.render`): 5 categories of objects
made of analytic primitives (:func:`make_object`), cameras on a sphere (:class:`Camera`, :func:`camera_rays`), first
hits and normals (:func:`trace`), Lambertian shading under 6 lighting conditions and a one-pixel blur
(:func:`render_object`). Vectorised in torch, float32; see :mod:`~capsule_lib.data.render` for the geometry and the
dataset it makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["CATEGORIES", "N_LIGHTINGS", "Primitives", "Camera", "make_object", "camera_rays", "trace", "render_object"]

#: the object categories, in smallNORB's order
CATEGORIES = ["animal", "human", "airplane", "truck", "car"]
#: lighting conditions per view (as smallNORB)
N_LIGHTINGS = 6
ELLIPSOID, BOX, CYLINDER = 0, 1, 2


# ------------------------------------------------------------------------------------------ geometry
@dataclass
class Primitives:
    """``P`` analytic primitives: ``kind [P]`` (0 ellipsoid, 1 box, 2 capped elliptic cylinder along its
    local z), ``center [P, 3]``, ``rot [P, 3, 3]`` (columns = local axes in world coordinates),
    ``size [P, 3]`` (radii; half-extents; (radius_x, radius_y, half-height)), ``albedo [P]``."""

    kind: torch.Tensor
    center: torch.Tensor
    rot: torch.Tensor
    size: torch.Tensor
    albedo: torch.Tensor

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    def surface_points(self, n: int = 64) -> torch.Tensor:
        """Points on every primitive's surface ``[P * n', 3]`` (for bounds; ellipsoids and cylinders are
        sampled, boxes contribute their corners)."""
        k = torch.arange(n, dtype=torch.float32) + 0.5
        z = 1 - 2 * k / n
        phi = k * math.pi * (3 - math.sqrt(5))
        r = torch.sqrt(1 - z * z)
        sphere = torch.stack([r * torch.cos(phi), r * torch.sin(phi), z], -1)  # [n, 3] Fibonacci sphere
        ang = torch.arange(n // 2, dtype=torch.float32) * (4 * math.pi / n)
        ring = torch.stack([torch.cos(ang), torch.sin(ang)], -1)
        cyl = torch.cat([torch.cat([ring, torch.full((n // 2, 1), sgn)], -1) for sgn in (-1.0, 1.0)])  # [n, 3]
        corners = torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=torch.float32)
        box = corners[torch.arange(n) % 8]
        unit = torch.stack([sphere, box, cyl])[self.kind]  # [P, n, 3]
        pts = self.center[:, None] + torch.einsum("pij,pnj->pni", self.rot, unit * self.size[:, None])
        return pts.reshape(-1, 3)


def _rz(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=np.float64)


def _ry(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]], dtype=np.float64)


def _rx(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]], dtype=np.float64)


def _z_to(v: Sequence[float]) -> np.ndarray:
    """A rotation whose third column (local z) points along ``v``."""
    z = np.asarray(v, dtype=np.float64)
    z = z / np.linalg.norm(z)
    helper = np.array([0.0, 0.0, 1.0]) if abs(z[2]) < 0.9 else np.array([1.0, 0.0, 0.0])
    x = np.cross(helper, z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    return np.stack([x, y, z], axis=1)


class _Builder:
    def __init__(self) -> None:
        self.parts: list[tuple[int, np.ndarray, np.ndarray, np.ndarray, float]] = []

    def ellipsoid(self, c, radii, rot=None, albedo=0.8):
        self.parts.append((ELLIPSOID, np.asarray(c, float), np.eye(3) if rot is None else rot, np.asarray(radii, float), albedo))

    def box(self, c, half, rot=None, albedo=0.8):
        self.parts.append((BOX, np.asarray(c, float), np.eye(3) if rot is None else rot, np.asarray(half, float), albedo))

    def cylinder(self, c, rx, ry, hh, rot=None, albedo=0.8):
        self.parts.append((CYLINDER, np.asarray(c, float), np.eye(3) if rot is None else rot,
                           np.array([rx, ry, hh], float), albedo))

    def segment(self, a, b, r, albedo=0.8):
        """A cylinder of radius ``r`` from point ``a`` to point ``b``."""
        a, b = np.asarray(a, float), np.asarray(b, float)
        self.cylinder((a + b) / 2, r, r, np.linalg.norm(b - a) / 2, _z_to(b - a), albedo)

    def build(self) -> Primitives:
        kind = torch.tensor([p[0] for p in self.parts], dtype=torch.long)
        center = torch.tensor(np.stack([p[1] for p in self.parts]), dtype=torch.float32)
        rot = torch.tensor(np.stack([p[2] for p in self.parts]), dtype=torch.float32)
        size = torch.tensor(np.stack([p[3] for p in self.parts]), dtype=torch.float32)
        albedo = torch.tensor([p[4] for p in self.parts], dtype=torch.float32)
        return Primitives(kind, center, rot, size, albedo)


def _animal(rng: np.random.Generator, b: _Builder) -> None:
    L, W, H = rng.uniform(0.55, 0.85), rng.uniform(0.2, 0.3), rng.uniform(0.18, 0.28)
    leg, lr = rng.uniform(0.35, 0.6), rng.uniform(0.05, 0.08)
    z = leg + 0.6 * H
    a = rng.uniform(0.6, 0.9)
    b.ellipsoid((0, 0, z), (L, W, H), albedo=a)
    for sx in (-1, 1):
        for sy in (-1, 1):
            b.segment((sx * 0.7 * L, sy * 0.6 * W, z - 0.3 * H), (sx * 0.72 * L, sy * 0.62 * W, 0), lr, albedo=a * 0.9)
    neck_len, neck_ang = rng.uniform(0.15, 0.45), rng.uniform(0.3, 1.2)
    n0 = np.array([0.85 * L, 0, z + 0.3 * H])
    n1 = n0 + neck_len * np.array([math.cos(neck_ang), 0, math.sin(neck_ang)])
    b.segment(n0, n1, rng.uniform(0.07, 0.11), albedo=a)
    hs = rng.uniform(0.13, 0.2)
    b.ellipsoid(n1 + np.array([0.5 * hs, 0, 0]), (hs * rng.uniform(1.2, 1.8), hs * 0.8, hs * 0.8), albedo=a)
    tail_ang = rng.uniform(-0.6, 0.9)
    t0 = np.array([-0.95 * L, 0, z + 0.2 * H])
    b.segment(t0, t0 + rng.uniform(0.2, 0.45) * np.array([-math.cos(tail_ang), 0, math.sin(tail_ang)]), 0.035,
              albedo=a * 0.8)


def _human(rng: np.random.Generator, b: _Builder) -> None:
    leg = rng.uniform(0.75, 0.95)
    torso_h, tw = rng.uniform(0.55, 0.7), rng.uniform(0.22, 0.3)
    a = rng.uniform(0.6, 0.9)
    hip = leg
    stance = rng.uniform(0.05, 0.18)
    for sy in (-1, 1):
        b.segment((0, sy * 0.45 * tw, hip), (rng.uniform(-0.1, 0.1), sy * (0.45 * tw + stance), 0), 0.07, albedo=a * 0.85)
    b.ellipsoid((0, 0, hip + 0.05), (0.16, tw, 0.14), albedo=a * 0.85)
    b.ellipsoid((0, 0, hip + torso_h / 2 + 0.05), (0.15, tw, torso_h / 2), albedo=a)
    hs = rng.uniform(0.11, 0.15)
    b.ellipsoid((0.02, 0, hip + torso_h + 0.05 + hs), (hs, hs * 0.9, hs * 1.15), albedo=a)
    sh = hip + torso_h - 0.02
    arm = rng.uniform(0.55, 0.7)
    for sy in (-1, 1):
        up, fwd = rng.uniform(-1.3, 0.6), rng.uniform(-0.6, 0.8)
        d = np.array([math.sin(fwd) * math.cos(up), sy * 0.35, -math.cos(fwd) * math.cos(up) + math.sin(up)])
        d /= np.linalg.norm(d)
        s0 = np.array([0, sy * (tw + 0.03), sh])
        b.segment(s0, s0 + arm * d, 0.055, albedo=a * 0.9)


def _airplane(rng: np.random.Generator, b: _Builder) -> None:
    fl, fr = rng.uniform(0.9, 1.2), rng.uniform(0.1, 0.15)
    z = rng.uniform(0.2, 0.35)
    a = rng.uniform(0.65, 0.9)
    b.ellipsoid((0, 0, z), (fl, fr, fr * rng.uniform(0.9, 1.2)), albedo=a)
    span, chord = rng.uniform(0.7, 1.1), rng.uniform(0.16, 0.28)
    sweep = rng.uniform(-0.15, 0.6)
    wx = rng.uniform(-0.15, 0.15)
    for sy in (-1, 1):
        rot = _rz(sy * sweep) @ _rx(sy * rng.uniform(0.0, 0.12))
        b.box((wx - sy * 0.0 - math.sin(sweep) * span / 2, sy * span / 2, z - 0.4 * fr), (chord / 2, span / 2, 0.02),
              rot=rot, albedo=a * 0.95)
    ts = rng.uniform(0.25, 0.4)
    b.box((-0.88 * fl, 0, z + 0.2 * fr), (0.09, ts, 0.015), albedo=a * 0.95)
    fin_h = rng.uniform(0.18, 0.32)
    b.box((-0.85 * fl, 0, z + fr + fin_h / 2 - 0.03), (0.12, 0.015, fin_h / 2), rot=_ry(-0.35), albedo=a * 0.9)
    if rng.uniform() < 0.6:
        for sy in (-1, 1):
            b.cylinder((wx + 0.1 - math.sin(sweep) * span * 0.35, sy * span * 0.38, z - fr - 0.02), 0.05, 0.05, 0.14,
                       rot=_z_to((1, 0, 0)), albedo=a * 0.6)


def _wheels(b: _Builder, xs: Sequence[float], half_w: float, r: float) -> None:
    for x in xs:
        for sy in (-1, 1):
            b.cylinder((x, sy * half_w, r), r, r, 0.06, rot=_z_to((0, 1, 0)), albedo=0.3)


def _truck(rng: np.random.Generator, b: _Builder) -> None:
    r = rng.uniform(0.12, 0.17)
    w = rng.uniform(0.3, 0.4)
    cab_l, cab_h = rng.uniform(0.3, 0.42), rng.uniform(0.45, 0.6)
    cargo_l, cargo_h = rng.uniform(0.9, 1.3), rng.uniform(0.5, 0.75)
    a = rng.uniform(0.6, 0.9)
    x_front = (cab_l + cargo_l) / 2
    b.box((x_front - cab_l / 2, 0, r + cab_h / 2), (cab_l / 2, w * 0.95, cab_h / 2), albedo=a)
    b.box((x_front - cab_l - 0.04 - cargo_l / 2, 0, r + 0.05 + cargo_h / 2), (cargo_l / 2, w, cargo_h / 2),
          albedo=a * rng.uniform(0.75, 1.0))
    b.box((0, 0, r * 0.9), ((cab_l + cargo_l) / 2 + 0.02, w * 0.8, 0.05), albedo=0.4)
    _wheels(b, (x_front - cab_l / 2, x_front - cab_l - 0.2 * cargo_l, x_front - cab_l - 0.75 * cargo_l), w * 0.85, r)


def _car(rng: np.random.Generator, b: _Builder) -> None:
    r = rng.uniform(0.1, 0.14)
    L, w = rng.uniform(0.8, 1.05), rng.uniform(0.3, 0.38)
    body_h = rng.uniform(0.12, 0.2)
    a = rng.uniform(0.6, 0.9)
    b.box((0, 0, r + body_h / 2), (L, w, body_h / 2), albedo=a)
    cab_l, cab_h = rng.uniform(0.35, 0.6) * L, rng.uniform(0.13, 0.22)
    cx = rng.uniform(-0.25, 0.05) * L
    if rng.uniform() < 0.5:
        b.ellipsoid((cx, 0, r + body_h), (cab_l, w * 0.88, cab_h * 1.3), albedo=a * 0.85)
    else:
        b.box((cx, 0, r + body_h + cab_h / 2), (cab_l, w * 0.85, cab_h / 2), albedo=a * 0.85)
    _wheels(b, (0.65 * L, -0.65 * L), w * 0.9, r)


_SHAPES = [_animal, _human, _airplane, _truck, _car]


def make_object(category: int, instance: int, seed: int = 0) -> Primitives:
    """The primitives of object ``instance`` (0-9) of ``category`` (0-4), centred at the origin and scaled
    to bounding radius 1 (deterministic in ``seed``)."""
    if not 0 <= category < len(CATEGORIES):
        raise ValueError(f"category must be in 0..{len(CATEGORIES) - 1}, got {category}")
    rng = np.random.default_rng([seed, category, instance, 7919])
    b = _Builder()
    _SHAPES[category](rng, b)
    prims = b.build()
    pts = prims.surface_points()
    mid = (pts.min(0).values + pts.max(0).values) / 2
    scale = 1.0 / float((pts - mid).norm(dim=-1).max())
    prims.center = (prims.center - mid) * scale
    prims.size = prims.size * scale
    return prims


# ------------------------------------------------------------------------------------------ cameras
@dataclass
class Camera:
    """Camera rig: distance to the object centre, vertical/horizontal field of view, stereo baseline."""

    distance: float = 4.3
    fov_deg: float = 30.0
    baseline: float = 0.3


def _look_at(pos: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Camera frames ``[..., 3, 3]`` (columns: right, up, forward) for positions ``[..., 3]``."""
    f = F.normalize(target - pos, dim=-1)
    up_w = torch.tensor([0.0, 0.0, 1.0]).expand_as(f)
    r = F.normalize(torch.cross(f, up_w, dim=-1), dim=-1)
    u = torch.cross(r, f, dim=-1)
    return torch.stack([r, u, f], dim=-1)


def camera_rays(elev_deg: torch.Tensor, azim_deg: torch.Tensor, size: int, cam: Camera) -> tuple[torch.Tensor, torch.Tensor]:
    """Rays of the stereo pair for ``V`` viewpoints: origins ``[V, 2, 3]`` and unit directions
    ``[V, 2, size*size, 3]`` (pixel order row-major, row 0 at the top)."""
    el, az = torch.deg2rad(elev_deg.float()), torch.deg2rad(azim_deg.float())
    centre = torch.stack([torch.cos(el) * torch.cos(az), torch.cos(el) * torch.sin(az), torch.sin(el)], -1) * cam.distance
    frame0 = _look_at(centre, torch.zeros(3))  # [V, 3, 3]
    right = frame0[..., 0]
    pos = torch.stack([centre - right * cam.baseline / 2, centre + right * cam.baseline / 2], 1)  # [V, 2, 3] (left, right)
    frame = _look_at(pos, torch.zeros(3))  # [V, 2, 3, 3] verging cameras
    t = math.tan(math.radians(cam.fov_deg) / 2)
    c = ((torch.arange(size, dtype=torch.float32) + 0.5) / size * 2 - 1) * t
    yy, xx = torch.meshgrid(-c, c, indexing="ij")
    local = F.normalize(torch.stack([xx.flatten(), yy.flatten(), torch.ones(size * size)], -1), dim=-1)  # [Q, 3]
    dirs = torch.einsum("vcij,qj->vcqi", frame, local)  # [V, 2, Q, 3], unit (frames are rotations)
    return pos, dirs


# ------------------------------------------------------------------------------------------ ray casting
_EPS = 1e-4


def _prim_radius(kind: int, size: torch.Tensor) -> float:
    """Radius of a sphere around a primitive's centre that contains it."""
    if kind == ELLIPSOID:
        return float(size.max())
    if kind == BOX:
        return float(size.norm())
    return float(torch.sqrt(size[:2].max() ** 2 + size[2] ** 2))


def _hit_primitive(kind: int, ol: torch.Tensor, dl: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Entry distance ``t [m]`` (inf = miss) of rays with local origins/directions ``[m, 3]`` into one
    primitive of ``kind`` with size ``s [3]`` (convex solids: entry = max of the entries of the slabs or
    quadrics that bound them)."""
    if kind == ELLIPSOID:
        ol, dl = ol / s, dl / s
        A = (dl * dl).sum(-1)
        B = (ol * dl).sum(-1)
        C = (ol * ol).sum(-1) - 1
        disc = B * B - A * C
        t = (-B - disc.clamp_min(0).sqrt()) / A
        return torch.where((disc > 0) & (t > _EPS), t, math.inf)
    if kind == BOX:
        inv = 1.0 / torch.where(dl.abs() < 1e-9, torch.full_like(dl, 1e-9), dl)
        t1, t2 = (-s - ol) * inv, (s - ol) * inv  # [m, 3]
        tn = torch.minimum(t1, t2).amax(-1)
        tf = torch.maximum(t1, t2).amin(-1)
        return torch.where((tf >= tn) & (tn > _EPS), tn, math.inf)
    sc = torch.stack([s[0], s[1], torch.ones_like(s[0])])
    ol, dl = ol / sc, dl / sc
    A = dl[:, 0] ** 2 + dl[:, 1] ** 2
    B = ol[:, 0] * dl[:, 0] + ol[:, 1] * dl[:, 1]
    C = ol[:, 0] ** 2 + ol[:, 1] ** 2 - 1
    disc = B * B - A * C
    sq = disc.clamp_min(0).sqrt()
    axial = A < 1e-12  # ray parallel to the axis: inside the infinite cylinder iff C <= 0
    Asafe = torch.where(axial, torch.ones_like(A), A)
    tin = torch.where(axial, torch.where(C <= 0, -math.inf, math.inf), (-B - sq) / Asafe)
    tout = torch.where(axial, torch.where(C <= 0, math.inf, -math.inf), (-B + sq) / Asafe)
    dz = torch.where(dl[:, 2].abs() < 1e-9, torch.full_like(A, 1e-9), dl[:, 2])
    z1, z2 = (-s[2] - ol[:, 2]) / dz, (s[2] - ol[:, 2]) / dz
    tn = torch.maximum(tin, torch.minimum(z1, z2))
    tf = torch.minimum(tout, torch.maximum(z1, z2))
    return torch.where((disc >= 0) & (tf >= tn) & (tn > _EPS), tn, math.inf)


def trace(origins: torch.Tensor, dirs: torch.Tensor, prims: Primitives) -> tuple[torch.Tensor, torch.Tensor]:
    """First hits of the rays of ``R`` cameras: ``origins [R, 3]``, unit ``dirs [R, Q, 3]`` ->
    distance ``t [R, Q]`` (inf = miss) and index of the primitive hit ``[R, Q]`` (-1 = miss).

    One primitive at a time, only the rays that pass through its bounding sphere are intersected
    (a batched matrix product finds them), so the cost scales with the projected area of the parts rather
    than with (pixels x parts)."""
    R, Q, _ = dirs.shape
    t_best = torch.full((R * Q,), math.inf)
    which = torch.full((R * Q,), -1, dtype=torch.long)
    d_flat = dirs.reshape(-1, 3)
    for p in range(len(prims)):
        kind = int(prims.kind[p])
        c, rot, s = prims.center[p], prims.rot[p], prims.size[p]
        rad = _prim_radius(kind, s)
        oc = origins - c  # [R, 3]
        b = torch.bmm(dirs, oc[:, :, None])[..., 0]  # [R, Q]  (o - c) . d
        cc = (oc * oc).sum(-1) - rad * rad  # [R]
        idx = ((b * b > cc[:, None]) & (b < 0)).flatten().nonzero().flatten()
        if idx.numel() == 0:
            continue
        ol = (oc @ rot)[idx // Q]  # [m, 3] local origins
        dl = d_flat[idx] @ rot  # [m, 3] local directions
        t = _hit_primitive(kind, ol, dl, s)
        better = t < t_best[idx]
        idx, t = idx[better], t[better]
        t_best[idx] = t
        which[idx] = p
    return t_best.view(R, Q), which.view(R, Q)


def _normals(p: torch.Tensor, which: torch.Tensor, prims: Primitives) -> torch.Tensor:
    """Unit outward normals ``[M, 3]`` at hit points ``p [M, 3]`` on primitives ``which [M]``."""
    c, R, s, kind = prims.center[which], prims.rot[which], prims.size[which], prims.kind[which]
    q = torch.einsum("mk,mkj->mj", p - c, R)  # [M, 3] local hit point
    n_ell = q / (s * s)
    rel = q.abs() / s
    ax = rel.argmax(-1)
    n_box = F.one_hot(ax, 3).float() * torch.sign(q)
    radial = torch.sqrt((q[:, 0] / s[:, 0]) ** 2 + (q[:, 1] / s[:, 1]) ** 2)
    cap = (q[:, 2].abs() / s[:, 2]) > radial
    n_side = torch.stack([q[:, 0] / s[:, 0] ** 2, q[:, 1] / s[:, 1] ** 2, torch.zeros_like(q[:, 0])], -1)
    n_cap = torch.stack([torch.zeros_like(q[:, 0]), torch.zeros_like(q[:, 0]), torch.sign(q[:, 2])], -1)
    n_cyl = torch.where(cap[:, None], n_cap, n_side)
    n = torch.where((kind == ELLIPSOID)[:, None], n_ell, torch.where((kind == BOX)[:, None], n_box, n_cyl))
    return F.normalize(torch.einsum("mij,mj->mi", R, n), dim=-1)


# ------------------------------------------------------------------------------------------ lighting
# Each condition: ambient, background level, then (azimuth offset deg, elevation deg, intensity) lights,
# azimuth relative to the camera azimuth (the lights turn with the cameras, as in smallNORB).
_LIGHTINGS: list[tuple[float, float, list[tuple[float, float, float]]]] = [
    (0.25, 0.35, [(-40, 50, 0.85)]),
    (0.25, 0.30, [(45, 40, 0.85)]),
    (0.30, 0.40, [(0, 70, 0.8)]),
    (0.15, 0.22, [(-90, 25, 0.9)]),
    (0.20, 0.38, [(-50, 45, 0.55), (60, 35, 0.5)]),
    (0.35, 0.45, [(-30, 60, 0.35), (40, 55, 0.35), (180, 30, 0.4)]),
]


def _light_dirs(azim_deg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per view: light directions ``[V, 6, K, 3]`` (unit, towards the light), intensities ``[6, K]``,
    ambient ``[6]``, background ``[6]`` (K = 3, unused lights have intensity 0)."""
    K = max(len(l[2]) for l in _LIGHTINGS)
    off = torch.zeros(N_LIGHTINGS, K)
    ele = torch.zeros(N_LIGHTINGS, K)
    inten = torch.zeros(N_LIGHTINGS, K)
    for i, (_, _, lights) in enumerate(_LIGHTINGS):
        for k, (a, e, w) in enumerate(lights):
            off[i, k], ele[i, k], inten[i, k] = a, e, w
    az = torch.deg2rad(azim_deg.float()[:, None, None] + off[None])  # [V, 6, K]
    el = torch.deg2rad(ele)[None].expand_as(az)
    dirs = torch.stack([torch.cos(el) * torch.cos(az), torch.cos(el) * torch.sin(az), torch.sin(el)], -1)
    amb = torch.tensor([l[0] for l in _LIGHTINGS])
    bg = torch.tensor([l[1] for l in _LIGHTINGS])
    return dirs, inten, amb, bg


def _blur(img: torch.Tensor) -> torch.Tensor:
    """Separable [1, 2, 1] / 4 blur over the last two axes (replicate edges), in place on a copy."""
    for dim in (-2, -1):
        x = img
        img = x * 0.5
        n = x.shape[dim]
        img.narrow(dim, 1, n - 1).add_(x.narrow(dim, 0, n - 1), alpha=0.25)
        img.narrow(dim, 0, n - 1).add_(x.narrow(dim, 1, n - 1), alpha=0.25)
        img.narrow(dim, 0, 1).add_(x.narrow(dim, 0, 1), alpha=0.25)
        img.narrow(dim, n - 1, 1).add_(x.narrow(dim, n - 1, 1), alpha=0.25)
    return img


def render_object(prims: Primitives, elevations: torch.Tensor, azimuths: torch.Tensor, size: int = 96,
                  camera: Camera | None = None, blur: bool = True) -> torch.Tensor:
    """Render ``V`` viewpoints (elevation / azimuth **indices**, ``[V]`` each) of one object under all 6
    lightings: float images in [0, 1], ``[V, 6, 2, size, size]`` (lighting, then left/right camera)."""
    cam = camera or Camera()
    el_deg = torch.as_tensor(elevations).long() * 5 + 30
    az_deg = torch.as_tensor(azimuths).long() * 20
    V = el_deg.shape[0]
    Q = size * size
    pos, dirs = camera_rays(el_deg, az_deg, size, cam)  # [V, 2, 3], [V, 2, Q, 3]
    t, which = trace(pos.reshape(-1, 3), dirs.reshape(V * 2, Q, 3), prims)  # [2V, Q]
    hit = (which >= 0).flatten()
    hidx = hit.nonzero().flatten()  # rays that hit something
    vc = hidx // Q
    w = which.flatten()[hidx]
    d = dirs.reshape(-1, 3)[hidx]
    p = pos.reshape(-1, 3)[vc] + t.flatten()[hidx, None] * d
    n = _normals(p, w, prims)  # [H, 3]
    ldir, inten, amb, bg = _light_dirs(az_deg)  # [V, 6, K, 3], [6, K], [6], [6]
    lam = torch.einsum("hi,hlki->hlk", n, ldir[vc // 2]).clamp_min(0)  # [H, 6, K]
    shade = prims.albedo[w][:, None] * (amb[None] + (lam * inten[None]).sum(-1))  # [H, 6]
    img = bg.view(1, N_LIGHTINGS, 1).expand(2 * V, N_LIGHTINGS, Q).clone()  # [2V, 6, Q]
    img = img.permute(0, 2, 1).reshape(-1, N_LIGHTINGS)  # [2V*Q, 6]
    img[hidx] = shade
    img = img.view(V, 2, size, size, N_LIGHTINGS).permute(0, 4, 1, 2, 3)  # [V, 6, 2, H, W]
    if blur:
        img = _blur(img)
    return img.clamp(0, 1).contiguous()


