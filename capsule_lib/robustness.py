"""Robustness measurements built on :mod:`capsule_lib.attacks`: accuracy against the attack budget, the checks
that an evaluation is not fooled by gradient masking, and detection of adversarial images by reconstruction.

* :func:`attack_curve`: accuracy at every budget of a list, per image (an :class:`AttackCurve`), for FGSM (one
  gradient per image for all budgets) or BIM. A BIM curve counts an image as robust at a budget only if no BIM
  run at that or a smaller budget fooled it (an adversarial image within ``eps`` is one within every larger
  budget too), and each run keeps an image's first fooling iterate (``early_stop``): the worst case over the
  runs, and the images already fooled cost nothing at the larger budgets.
* :func:`masking_check`: Athalye et al.'s sanity checks. If the routing hid the gradient, an iterative attack
  with more steps and random restarts would do *worse* than one gradient step, and a large budget would not
  bring the accuracy to about zero.
* :func:`detection`: DARCCC (Frosst et al. 2018). Flag an input whose L2 distance to the reconstruction from
  the winning class capsule exceeds a threshold set on clean validation images (their 95th percentile: 5% false
  positives), and measure how many successful adversarial images it flags.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ._checks import check_choice, check_class_labels, float_images
from ._contracts import checked
from .attacks import (
    Objective,
    _scores,
    attack_loss,
    bim,
    fgsm_sweep,
    reconstruction_aware_objective,
    reconstruction_distance,
)
from .evaluation import accuracy_standard_error
from .losses import reconstruction_target

__all__ = [
    "AttackCurve",
    "attack_curve",
    "masking_check",
    "reconstruction_distances",
    "Detection",
    "detection",
    "AdversarialExample",
    "adversarial_examples",
    "attack_curves",
    "targeted_success",
    "curve_table",
    "masking_table",
    "detection_table",
    "compare_to_em_paper",
]


@dataclass
class AttackCurve:
    """Which images a model still classifies correctly under an attack, at each budget.

    Attributes
    ----------
    attack
        What was run, in words (``"FGSM"``, ``"BIM, 10 steps"``).
    eps
        The budgets ``[E]``, ascending; ``eps[0] = 0`` is the clean image.
    correct
        ``[E, N]`` booleans: image ``n`` classified correctly after the attack at ``eps[e]``.
    """

    attack: str
    eps: tuple[float, ...]
    correct: torch.Tensor

    def accuracy(self, n: int | None = None) -> list[float]:
        """Accuracy at every budget, on the first ``n`` images (default: all)."""
        c = self.correct[:, :n].float()
        return [float(v) for v in c.mean(1)]

    def at(self, eps: float, n: int | None = None) -> float:
        """Accuracy at budget ``eps`` (one of :attr:`eps`), on the first ``n`` images."""
        if float(eps) not in self.eps:
            raise ValueError(f"eps {eps} was not measured; this curve has {list(self.eps)}")
        return self.accuracy(n)[self.eps.index(float(eps))]


def _budgets(eps: Sequence[float]) -> tuple[float, ...]:
    """The budgets, sorted, with the clean image's 0: one line unless each is an L-infinity distance in [0, 1]."""
    if len(eps) == 0 or not all(isinstance(v, (int, float)) and 0.0 <= v <= 1.0 for v in eps):
        raise ValueError(f"eps: budgets must be L-infinity distances in [0, 1] on [0, 1] pixels, got {list(eps)[:8]}")
    return tuple(sorted({0.0, *map(float, eps)}))


def attack_curve(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: Sequence[float],
    attack: str = "fgsm",
    *,
    steps: int = 10,
    batch_size: int = 100,
    progress=None,
) -> AttackCurve:
    """The model's accuracy under ``attack`` (``"fgsm"`` or ``"bim"``, untargeted, the common loss
    :func:`~capsule_lib.attacks.attack_loss`) at every budget of ``eps`` (0 is added: the clean accuracy).

    Parameters
    ----------
    model
        A classifier in eval mode; the attack runs on its device.
    images, labels
        ``[N, C, H, W]`` (uint8 or float in [0, 1]) and ``[N]``.
    eps
        The budgets (L-infinity, pixels in [0, 1]).
    attack
        ``"fgsm"``: one signed-gradient step of the whole budget. ``"bim"``: ``steps`` steps of ``eps / steps``,
        nested over the budgets (module docstring).
    steps
        BIM's steps per budget.
    batch_size
        Images per attack batch.
    progress
        A callable wrapping the batch iterator (e.g. ``tqdm``), or ``None``.

    Returns
    -------
    AttackCurve
        Per-image correctness ``[E, N]`` at the sorted budgets.
    """
    if attack not in ("fgsm", "bim"):
        raise ValueError(f"attack must be 'fgsm' or 'bim', got {attack!r}")
    budgets, device = _budgets(eps), next(model.parameters()).device
    x_all, y_all = float_images(images), labels.long()
    correct = torch.zeros(len(budgets), len(x_all), dtype=torch.bool)
    starts = range(0, len(x_all), batch_size)
    for s in progress(starts) if progress is not None else starts:
        x, y = x_all[s : s + batch_size].to(device), y_all[s : s + batch_size].to(device)
        if attack == "fgsm":
            with torch.no_grad():
                for e, x_adv in enumerate(fgsm_sweep(model, x, y, budgets)):
                    correct[e, s : s + len(x)] = (_predict(model, x_adv) == y).cpu()
            continue
        with torch.no_grad():
            ok = _predict(model, x) == y  # [b]: robust so far (clean, then at every smaller budget)
        correct[0, s : s + len(x)] = ok.cpu()
        for e, budget in enumerate(budgets[1:], start=1):
            i = ok.nonzero().squeeze(1)  # only the images no smaller budget fooled
            if len(i):
                x_adv = bim(model, x[i], y[i], budget, steps=steps, early_stop=True)
                with torch.no_grad():
                    ok[i] = _predict(model, x_adv) == y[i]
            correct[e, s : s + len(x)] = ok.cpu()
    name = "FGSM" if attack == "fgsm" else f"BIM, {steps} steps"
    return AttackCurve(name, budgets, correct)


def _predict(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return _scores(model, x).argmax(1)


@checked
def masking_check(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    fgsm: AttackCurve,
    bim_curve: AttackCurve,
    *,
    eps: float = 0.1,
    n: int = 50,
    steps: int = 20,
    restarts: int = 2,
    large_eps: float = 0.5,
    seed: int = 0,
) -> dict[str, float]:
    """The gradient-masking checks on the first ``n`` of ``images`` (the images ``fgsm`` and ``bim_curve`` were
    measured on): accuracy under FGSM and BIM at ``eps`` (read from the curves), under PGD (``steps`` steps from
    ``restarts`` random starts in the ball, Madry et al.'s step ``2.5 eps / steps``) at ``eps``, and under BIM
    (10 steps) at ``large_eps``.

    Returns
    -------
    dict
        ``fgsm``, ``bim``, ``pgd``, ``large`` (accuracies) and the verdicts ``iterative_not_weaker`` (BIM and PGD
        each at most FGSM's accuracy) and ``large_to_zero`` (at most 2% at ``large_eps``), as 1.0 / 0.0.
    """
    if fgsm.correct.shape[1] < n or bim_curve.correct.shape[1] < n:
        raise ValueError(f"the curves cover {fgsm.correct.shape[1]} and {bim_curve.correct.shape[1]} images, need {n}")
    g = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    x, y = float_images(images[:n]).to(device), labels[:n].long().to(device)
    x_p = bim(model, x, y, eps, steps=steps, random_start=True, restarts=restarts, early_stop=True, generator=g)
    x_l = bim(model, x, y, large_eps, steps=10, early_stop=True)
    with torch.no_grad():
        pgd, large = (float((_predict(model, a) == y).float().mean()) for a in (x_p, x_l))
    out = {"fgsm": fgsm.at(eps, n), "bim": bim_curve.at(eps, n), "pgd": pgd, "large": large}
    out["iterative_not_weaker"] = float(out["bim"] <= out["fgsm"] and out["pgd"] <= out["fgsm"])
    out["large_to_zero"] = float(out["large"] <= 0.02)
    return out


def reconstruction_distances(model: nn.Module, images: torch.Tensor, batch_size: int = 200) -> torch.Tensor:
    """DARCCC's statistic for every image ``[N, C, H, W]``: the L2 distance ``[N]`` between the image and the
    model's reconstruction from its winning class capsule (the model's output with no label given)."""
    x_all, device, out = float_images(images), next(model.parameters()).device, []
    with torch.no_grad():
        for s in range(0, len(x_all), batch_size):
            x = x_all[s : s + batch_size].to(device)
            out_x = model(x)
            recon = out_x.reconstruction
            if recon is None:
                raise ValueError("reconstruction distances need a model with a decoder (output.reconstruction)")
            out.append(reconstruction_distance(reconstruction_target(out_x, x), recon).cpu())
    return torch.cat(out)


@dataclass
class Detection:
    """DARCCC on one model and one attack.

    Attributes
    ----------
    threshold
        The distance above which an input is flagged: the 95th percentile (``1 - fpr``) of the clean validation
        images' distances.
    clean
        Distances of the clean test images ``[N]``.
    attacked
        Distances of the attacked test images ``[N]``.
    fooled
        ``[N]``: the attack changed a correct prediction (only these count as adversarial examples).
    """

    threshold: float
    clean: torch.Tensor
    attacked: torch.Tensor
    fooled: torch.Tensor

    @property
    def false_positive_rate(self) -> float:
        """Clean test images flagged."""
        return float((self.clean > self.threshold).float().mean())

    @property
    def detection_rate(self) -> float:
        """Successful adversarial images flagged (``nan`` when the attack fooled none)."""
        d = self.attacked[self.fooled]
        return float((d > self.threshold).float().mean()) if len(d) else float("nan")

    @property
    def success_rate(self) -> float:
        """Images the attack fooled, of all attacked images."""
        return float(self.fooled.float().mean())

    @property
    def undetected_rate(self) -> float:
        """Images the attack fooled *and* the detector let through, of all attacked images."""
        return float((self.fooled & (self.attacked <= self.threshold)).float().mean())


@checked
def detection(
    model: nn.Module,
    val_images: torch.Tensor,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: float,
    attacks: dict[str, float] | None = None,
    *,
    steps: int = 10,
    fpr: float = 0.05,
    batch_size: int = 100,
) -> dict[str, Detection]:
    """Detect BIM adversarial images by their reconstruction distance (DARCCC), for each attack of ``attacks``.

    The threshold is the ``1 - fpr`` quantile of the distances of ``val_images`` (clean validation images, never
    the test images), computed once. ``images`` / ``labels`` (test images the model classifies) are attacked with
    BIM at ``eps`` (``steps`` steps) once per entry of ``attacks``, name -> reconstruction weight (default
    ``{"BIM": 0.0}``). Weight 0: plain BIM, an image's first fooling iterate kept. Weight ``w > 0``: the
    reconstruction-aware attack, which ascends ``CE - w * ||x - reconstruction||``
    (:func:`~capsule_lib.attacks.reconstruction_aware_objective`) so the distance stays small while the class
    changes; it takes every step (no early stop), so that after the class has changed it goes on shrinking the
    distance. Returns name -> :class:`Detection`.
    """
    attacks = {"BIM": 0.0} if attacks is None else attacks
    threshold = float(torch.quantile(reconstruction_distances(model, val_images), 1 - fpr))
    x_all, y_all, device = float_images(images), labels.long(), next(model.parameters()).device
    clean: list[torch.Tensor] = []
    attacked: dict[str, list] = {a: [] for a in attacks}
    fooled: dict[str, list] = {a: [] for a in attacks}
    for s in range(0, len(x_all), batch_size):
        x, y = x_all[s : s + batch_size].to(device), y_all[s : s + batch_size].to(device)
        with torch.no_grad():
            out = model(x)
        clean.append(reconstruction_distance(reconstruction_target(out, x), out.reconstruction).cpu())
        ok = out.scores.argmax(1) == y
        for name, w in attacks.items():
            objective: Objective | None = reconstruction_aware_objective(w, attack_loss) if w > 0 else None
            x_adv = bim(model, x, y, eps, steps=steps, early_stop=objective is None, objective=objective)
            with torch.no_grad():
                out_a = model(x_adv)
            attacked[name].append(
                reconstruction_distance(reconstruction_target(out_a, x_adv), out_a.reconstruction).cpu()
            )
            fooled[name].append((ok & (out_a.scores.argmax(1) != y)).cpu())
    d_clean = torch.cat(clean)
    return {a: Detection(threshold, d_clean, torch.cat(attacked[a]), torch.cat(fooled[a])) for a in attacks}


@dataclass
class AdversarialExample:
    """One model's adversarial copy of one image at one budget.

    Attributes
    ----------
    image
        The attacked image ``[C, H, W]`` in [0, 1] (each model gets its own: the attacks are white-box).
    prediction
        The class the model predicts for it.
    reconstruction
        The model's reconstruction from its winning capsule ``[C, H, W]``, or ``None`` without a decoder.
    """

    image: torch.Tensor
    prediction: int
    reconstruction: torch.Tensor | None


@checked
def adversarial_examples(
    models: dict[str, nn.Module],
    image: torch.Tensor,
    label: int,
    eps: Sequence[float],
    attack: str = "fgsm",
    steps: int = 10,
) -> list[dict[str, AdversarialExample]]:
    """Each model's adversarial copy of one ``image [C, H, W]`` (true class ``label``) at every budget of
    ``eps``: ``[E]`` dicts, model name -> :class:`AdversarialExample` (what the epsilon explorer shows).
    ``attack``: ``"fgsm"`` (one gradient for all budgets) or ``"bim"`` (``steps`` steps, no early stop)."""
    check_choice(attack, ("fgsm", "bim"), "attack")
    _budgets(eps)
    n_classes = min((getattr(getattr(m, "config", None), "n_classes", 1 << 30) for m in models.values()), default=0)
    if not 0 <= label < n_classes:
        raise ValueError(f"adversarial_examples: label must be a class index 0..{n_classes - 1}, got {label}")
    x = float_images(image[None])
    out: list[dict[str, AdversarialExample]] = [{} for _ in eps]
    for name, model in models.items():
        device = next(model.parameters()).device
        xd, y = x.to(device), torch.tensor([label], device=device)
        if attack == "fgsm":
            advs = list(fgsm_sweep(model, xd, y, list(eps)))
        else:
            advs = [bim(model, xd, y, float(e), steps=steps) if e > 0 else xd for e in eps]
        with torch.no_grad():
            for k, x_adv in enumerate(advs):
                o = model(x_adv)
                scores = o.scores if hasattr(o, "scores") else o
                recon = getattr(o, "reconstruction", None)
                out[k][name] = AdversarialExample(
                    x_adv[0].cpu(), int(scores.argmax(1)), None if recon is None else recon[0].cpu()
                )
    return out


@checked
def attack_curves(
    models: dict[str, nn.Module],
    images: torch.Tensor,
    labels: torch.Tensor,
    plan: dict[str, dict],
    progress=None,
) -> dict[str, dict[str, AttackCurve]]:
    """:func:`attack_curve` for every model and every attack of ``plan`` (attack name -> ``{"attack": "fgsm" or
    "bim", "eps": [...], "n": images, "steps": ...}``, run on the first ``n`` images): model -> attack -> curve.
    ``progress`` wraps the model iterator (e.g. ``tqdm``)."""
    names = list(models)
    out: dict[str, dict[str, AttackCurve]] = {}
    for name in progress(names) if progress is not None else names:
        out[name] = {}
        for attack, kw in plan.items():
            kw = dict(kw)
            n = kw.pop("n", len(images))
            out[name][attack] = attack_curve(models[name], images[:n], labels[:n], **kw)
    return out


@checked
def targeted_success(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, eps: Sequence[float], n_classes: int
) -> list[float]:
    """Targeted FGSM's success rate at every budget of ``eps``, averaged over the target classes as Hinton et al.
    (2018) do: for each class ``t``, the images of the other classes are stepped down ``t``'s loss, and a success
    is a prediction of ``t``. Returns ``[E]`` rates (over all image-target pairs)."""
    if n_classes < 2:
        raise ValueError(
            f"targeted_success: n_classes must be >= 2 (a target other than the true class), got {n_classes}"
        )
    _budgets(eps)
    check_class_labels(labels, n_classes, "targeted_success", n=images.shape[0])
    device = next(model.parameters()).device
    x, y = float_images(images).to(device), labels.long().to(device)
    hits, pairs = torch.zeros(len(eps)), 0
    for t in range(n_classes):
        keep = y != t
        if not keep.any():
            continue
        target = torch.full_like(y[keep], t)
        with torch.no_grad():
            for e, x_adv in enumerate(fgsm_sweep(model, x[keep], target, list(eps), targeted=True)):
                hits[e] += int((_predict(model, x_adv) == t).sum())
        pairs += int(keep.sum())
    return [float(h) / max(pairs, 1) for h in hits]


def _pct(v: float) -> str:
    return "n/a" if v != v else f"{100 * v:.1f}"


@checked
def curve_table(curves: dict[str, dict[str, AttackCurve]], eps: Sequence[float]) -> tuple[list[str], list[list]]:
    """Headers and rows (one per model) of accuracy (%) clean and under every attack at each budget of ``eps``
    the curve measured (``-`` where it did not)."""
    attacks = list(next(iter(curves.values())))
    heads = ["model", "clean"] + [f"{a} {e:g}" for a in attacks for e in eps]
    rows = []
    for name, per in curves.items():
        first = per[attacks[0]]
        row = [name, _pct(first.accuracy()[0])]
        for a in attacks:
            c = per[a]
            row += [_pct(c.at(e)) if float(e) in c.eps else "-" for e in eps]
        rows.append(row)
    return heads, rows


@checked
def masking_table(checks: dict[str, dict[str, float]], eps: float, large_eps: float) -> tuple[list[str], list[list]]:
    """Headers and rows of :func:`masking_check` results, one per model, with the verdict in words."""
    heads = ["model", f"FGSM {eps:g}", f"BIM {eps:g}", f"PGD {eps:g}", f"BIM {large_eps:g}", "verdict"]
    rows = []
    for name, c in checks.items():
        why = []
        if not c["iterative_not_weaker"]:
            why.append("iterative attack weaker than FGSM")
        if not c["large_to_zero"]:
            why.append(f"{100 * c['large']:.0f}% left at eps {large_eps:g}")
        verdict = "consistent" if not why else "suspect: " + "; ".join(why)
        rows.append([name, *(_pct(c[k]) for k in ("fgsm", "bim", "pgd", "large")), verdict])
    return heads, rows


@checked
def detection_table(detections: dict[str, dict[str, Detection]]) -> tuple[list[str], list[list]]:
    """Headers and rows of DARCCC results: per model and attack, the threshold, the false positives on clean
    test images, the attack's success rate, the fooling images flagged, and the attack's undetected success."""
    heads = [
        "model",
        "attack",
        "threshold",
        "clean flagged (%)",
        "fooled (%)",
        "fooled, flagged (%)",
        "fooled, not flagged (%)",
    ]
    rows = []
    for name, per in detections.items():
        for attack, d in per.items():
            rows.append(
                [
                    name,
                    attack,
                    f"{d.threshold:.2f}",
                    _pct(d.false_positive_rate),
                    _pct(d.success_rate),
                    _pct(d.detection_rate),
                    _pct(d.undetected_rate),
                ]
            )
    return heads, rows


def _versus(a: float, b: float, n_a: int, n_b: int) -> str:
    """How two accuracies (or rates) measured on ``n_a`` and ``n_b`` images compare, at two standard errors."""
    se = math.hypot(accuracy_standard_error(a, n_a), accuracy_standard_error(b, n_b))
    if a - b > 2 * se:
        return "higher"
    if b - a > 2 * se:
        return "lower"
    return "within noise"


@checked
def compare_to_em_paper(
    curves: dict[str, dict[str, AttackCurve]],
    targeted: dict[str, list[float]],
    eps: Sequence[float],
    em: str = "EM",
    cnn: str = "CNN",
    chance: float = 0.2,
) -> tuple[list[str], list[list]]:
    """Hinton et al. (2018, section 6)'s adversarial claims on smallNORB next to what ``curves`` (model -> attack
    -> curve, with ``"FGSM"`` and ``"BIM"``) and ``targeted`` (model -> targeted FGSM success rate at each budget
    of ``eps``) measured for the ``em`` and ``cnn`` models. "holds" needs the difference beyond two standard
    errors of the measurements (binomial; chance is exact)."""
    fg_em, fg_cnn = curves[em]["FGSM"], curves[cnn]["FGSM"]
    n = fg_em.correct.shape[1]
    lowest = min(zip(fg_em.accuracy(), fg_em.eps))
    low_vs_chance = _versus(lowest[0], chance, n, 10**9)  # chance is exact: no error of its own
    rows = [
        [
            f"EM model, untargeted FGSM: accuracy never below chance ({100 * chance:.0f}%)",
            f"lowest {_pct(lowest[0])}% (eps {lowest[1]:g}, up to {max(fg_em.eps):g})",
            "does not hold" if low_vs_chance == "lower" else "holds",
        ],
    ]
    if 0.2 in fg_cnn.eps:
        cnn_vs_chance = _versus(fg_cnn.at(0.2), chance, fg_cnn.correct.shape[1], 10**9)
        rows.append(
            [
                "CNN, untargeted FGSM: significantly below chance at eps 0.2",
                f"{_pct(fg_cnn.at(0.2))}% at eps 0.2",
                {"lower": "holds", "higher": "does not hold", "within noise": "not significantly below chance"}[
                    cnn_vs_chance
                ],
            ]
        )
    for attack in ("FGSM", "BIM"):
        a, b = curves[em][attack], curves[cnn][attack]
        for e in (0.1, 0.2):
            if e in a.eps and e in b.eps:
                cmp = _versus(a.at(e), b.at(e), a.correct.shape[1], b.correct.shape[1])
                rows.append(
                    [
                        f"EM less vulnerable than the CNN, untargeted {attack}, eps {e:g}",
                        f"EM {_pct(a.at(e))}%, CNN {_pct(b.at(e))}% accuracy",
                        {"higher": "holds", "lower": "reversed", "within noise": "no clear difference"}[cmp],
                    ]
                )
    for e in (0.1, 0.2):
        if e in eps:
            k = list(eps).index(e)
            t_em, t_cnn = targeted[em][k], targeted[cnn][k]
            cmp = _versus(t_cnn, t_em, n, n)
            rows.append(
                [
                    f"EM less vulnerable than the CNN, targeted FGSM, eps {e:g}",
                    f"success EM {_pct(t_em)}%, CNN {_pct(t_cnn)}%",
                    {"higher": "holds", "lower": "reversed", "within noise": "no clear difference"}[cmp],
                ]
            )
    return ["claim (Hinton et al. 2018)", "measured here", "verdict"], rows
