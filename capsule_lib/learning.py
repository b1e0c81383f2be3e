"""Did a network learn? The book's rule for what may enter a comparison or a verdict, and a probe of a run's first
training steps that says why a network does not learn.

**The rule** (:func:`learned`, :func:`untrained`): a network counts in a comparison or a verdict only if its
validation accuracy is at least halfway from chance to the best validation accuracy of the networks trained on the
same data with the same budget (:data:`LEARNED_SHARE`). A network below that line is closer to guessing than to what
the same data and budget allow, so its accuracy measures a training run that did not start (a collapse, a plateau,
a vanishing gradient), not the idea it was built to test. The line is relative, so it holds for any number of
classes and any budget; it is lenient, so a network that learns slowly but really (EM with fixed couplings at 80%
where the best reaches 98% on MNIST) still counts, and strict enough that a network at chance never does. Model
selection and this rule read validation accuracy only, never the test split.

**Runs that break it** stay in the records, labelled with their measured cause (:data:`DID_NOT_TRAIN`): a table
shows them as :data:`DID_NOT_TRAIN_LABEL`, a verdict that rests on one as :data:`NOT_TESTED`, never "holds" or
"does not hold". :func:`unlabelled` lists the runs that break the rule without a label (``tests/test_learning.py``
fails on any in the shipped records).

**The first steps** (:func:`first_steps`): a recipe's network trained for a few hundred steps exactly as
:func:`~capsule_lib.train.train` would start it (same seed, data, optimiser and schedule), with, every few steps,
the validation accuracy on a fixed sample, the RMS gradient of each layer's weights, the input activations of a
routing that takes them and the lengths of capsules whose length is their score. ``benchmarks/learning_diagnostics.py``
runs it before and after each fix; :func:`diagnosis_rows` puts the results in a table.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ._checks import float_images
from ._contracts import checked
from .data import DataSource
from .train.recipes import Recipe

__all__ = [
    "LEARNED_SHARE",
    "CHANCE",
    "DID_NOT_TRAIN_LABEL",
    "NOT_TESTED",
    "DID_NOT_TRAIN",
    "learning_threshold",
    "learned",
    "untrained",
    "unlabelled",
    "first_steps",
    "DIAGNOSIS_HEADERS",
    "diagnosis_rows",
]

#: the share of the way from chance to the best network's validation accuracy a network must reach to count
LEARNED_SHARE = 0.5

#: chance accuracy (one over the classes) of the book's comparison data sets
CHANCE: dict[str, float] = {"mnist": 0.1, "norb": 0.2}

#: how a table shows a network that breaks the rule
DID_NOT_TRAIN_LABEL = "did not train"

#: how a verdict that rests on such a network is shown
NOT_TESTED = "not tested (did not train)"

#: runs kept in the shipped records although they break the rule, run or checkpoint name -> the measured cause
#: (every cause names the diagnostic that measured it)
DID_NOT_TRAIN: dict[str, str] = {
    **{
        f"critique_mnist_dynamic_routed_depth{k}_seed{s}": (
            "the paper's initialisation of the hidden layers (weights N(0, 0.01^2), biases 0.1): their votes are so "
            "short that each hidden layer outputs its bias, the same for every image, and the RMS gradient reaching "
            "the stem is below 1e-9 (benchmarks/learning_diagnostics.py depth); warm-up, a lower learning rate, 64 "
            "hidden capsules and a fan-in initialisation do not help; weights N(0, 1) and biases 0 do (the depth "
            "series with hidden_init='unit')"
        )
        for k in (3, 4)
        for s in (0, 1)
    },
    **{
        f"critique_norb_heinsen_2019_{couplings}_seed{s}": (
            "Heinsen 2019 with fixed couplings on the viewpoint protocol: its input activations are switched off "
            "within 300 steps although the learning rate is warmed up (mean sigma(a_i) 6e-09 with uniform couplings, "
            "92% of them off with random ones) and the loss stays at log 5 (benchmarks/learning_diagnostics.py "
            "heinsen_norb_fixed); the routed network, warmed up the same way, keeps them on and learns "
            "(heinsen_norb)"
        )
        for couplings in ("uniform", "random")
        for s in (0, 1)
    },
    **{
        f"critique_mnist_aff_capsnet_seed{s}": (
            "Aff-CapsNets' layer in one epoch over 30,000 images: its class capsules see only the sum of the primary "
            "capsules and stay on the margin loss's plateau (every length near 0.245, where the loss is lowest while "
            "the lengths cannot depend on the image) far longer than routed networks (benchmarks/"
            "learning_diagnostics.py shared); at three epochs it learns (critique_mnist_aff_capsnet_e3_*)"
        )
        for s in (0, 1)
    },
}


@checked
def learning_threshold(best: float, chance: float) -> float:
    """The validation accuracy a network must reach: :data:`LEARNED_SHARE` of the way from ``chance`` to ``best``."""
    if not 0.0 <= chance <= 1.0 or not 0.0 <= best <= 1.0:
        raise ValueError(f"chance and best must be accuracies in [0, 1], got chance={chance!r}, best={best!r}")
    return chance + LEARNED_SHARE * max(0.0, best - chance)


def learned(val_acc: float, best: float, chance: float) -> bool:
    """Whether a network with validation accuracy ``val_acc`` learned, against the ``best`` validation accuracy on the
    same data and budget and ``chance`` (:func:`learning_threshold`)."""
    if not 0.0 <= val_acc <= 1.0:
        raise ValueError(f"val_acc must be an accuracy in [0, 1], got {val_acc!r}")
    return val_acc >= learning_threshold(best, chance)


def untrained(runs: Mapping[str, float], chance: float) -> dict[str, float]:
    """The runs of ``runs`` (name -> validation accuracy, all on the same data and budget) that break the rule against
    the best of them: name -> its validation accuracy (empty when every run learned)."""
    if not runs:
        return {}
    best = max(runs.values())
    return {name: acc for name, acc in runs.items() if not learned(acc, best, chance)}


def unlabelled(runs: Mapping[str, float], chance: float, labels: Mapping[str, str] | None = None) -> list[str]:
    """The runs that break the rule (:func:`untrained`) and have no measured cause in ``labels`` (default
    :data:`DID_NOT_TRAIN`), sorted."""
    labels = DID_NOT_TRAIN if labels is None else labels
    return sorted(name for name in untrained(runs, chance) if name not in labels)


# ---------------------------------------------------------------------------------------------------------------------
# The first steps of a run
# ---------------------------------------------------------------------------------------------------------------------


def _layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's top-level layers with weights, a module list's items one by one (image side first)."""
    out = []
    for name, child in model.named_children():
        if isinstance(child, nn.ModuleList):
            out += [(f"{name}.{i}", c) for i, c in enumerate(child) if any(True for _ in c.parameters())]
        elif any(True for _ in child.parameters()):
            out.append((name, child))
    return out


def _rms(module: nn.Module) -> float:
    g = [p.grad.detach().flatten().double() for p in module.parameters() if p.grad is not None]
    return torch.cat(g).pow(2).mean().sqrt().item() if g else 0.0


@torch.no_grad()
def _probe(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Validation accuracy and the health of the network's capsules on the probe images."""
    was = model.training
    model.eval()
    try:
        kind, head = getattr(model, "kind", None), getattr(getattr(model, "config", None), "head", "routing")
        routed = kind is not None and head == "routing"
        out = model(x, return_routing=True) if routed else model(x)
        rec: dict[str, Any] = {"val_acc": (out.scores.argmax(1) == y).double().mean().item()}
        scores = out.scores.float()
        rec["score_spread"] = scores.std(1).mean().item()  # over the classes, averaged over the images
        if routed and kind.activations is not None and hasattr(model, "primary_capsules"):
            _, logits = model.primary_capsules(x)
            act = torch.sigmoid(logits.float())
            rec["activations"] = {"mean": act.mean().item(), "off": (act < 0.01).double().mean().item()}
        if out.kind == "lengths":  # capsules whose lengths are their scores: every routing layer's (or the head's)
            outputs = [t.outputs[-1] for t in out.extra["traces"]] if routed else [out.poses]
            rec["lengths"] = [
                {
                    "mean": (n := o.float().norm(dim=-1)).mean().item(),
                    "saturated": (n > 0.99).double().mean().item(),
                    "short": (n < 0.01).double().mean().item(),
                    "spread_over_images": n.std(0).mean().item(),
                }
                for o in outputs
            ]
        return rec
    finally:
        model.train(was)


def first_steps(
    recipe: Recipe,
    steps: int = 200,
    data_root: DataSource | str | None = None,
    every: int = 20,
    n_probe: int = 256,
    setup: Callable[[nn.Module], Any] | None = None,
) -> dict[str, Any]:
    """Train ``recipe``'s network for its first ``steps`` batches as :func:`~capsule_lib.train.train` starts it (the
    recipe's seed, data, augmentation, optimiser and learning-rate schedule, on the CPU) and measure it as it goes.

    Parameters
    ----------
    recipe : Recipe
        The run to probe (e.g. :func:`~capsule_lib.comparison.contestant_recipe`).
    steps : int, optional
        Training batches (default 200).
    data_root : DataSource or str or None, optional
        Where the data is (as :func:`~capsule_lib.train.train`'s).
    every : int, optional
        Probe every ``every`` steps, and at steps 0, 1, 2, 5, 10 and the last (default 20).
    n_probe : int, optional
        Validation images probed, a seeded random sample (default 256).
    setup : callable, optional
        Called on the network once it is built, before the optimiser sees it (e.g. to re-initialise a layer for an
        ablation); ``None`` (default): the recipe's network as is.

    Returns
    -------
    dict
        ``recipe`` (name), ``config`` (its fields), ``steps``, ``loss`` and ``lr`` (one per step), ``seconds``, and
        ``probes``: one dict per probed step with ``step`` (after that many updates: 0 is the network as built),
        ``val_acc`` on the probe images, ``score_spread`` (the class scores' spread over the classes, averaged over
        the images), ``grad_rms`` (layer name -> RMS gradient of its weights on that step's batch, image side first;
        absent at step 0), ``activations`` (a routing that takes them: the mean input activation and the share
        below 0.01, "off") and ``lengths`` (a network scored by capsule lengths: per routing layer, image side
        first, the mean length, the shares above 0.99, "saturated", and below 0.01, and the lengths' spread over
        the images).
    """
    for name, value in (("steps", steps), ("every", every), ("n_probe", n_probe)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe (e.g. make_recipe(name)), got {type(recipe).__name__}")
    t0 = time.time()
    device = torch.device("cpu")
    torch.manual_seed(recipe.seed)  # as train(): the loaders, then the model, from the recipe's seed
    loaders = recipe.loaders(DataSource.of(data_root), device, test=False)
    model = recipe.build_model().to(device)
    if setup is not None:
        setup(model)
    objective, optimizer = recipe.build_objective(), recipe.build_optimizer(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: recipe.lr_factor(step))
    if hasattr(objective, "set_epoch"):
        objective.set_epoch(0, recipe.epochs)
    val = [b for b in loaders.val]
    vx, vy = torch.cat([b[0] for b in val]), torch.cat([b[1] for b in val])
    pick = torch.randperm(len(vy), generator=torch.Generator().manual_seed(0))[:n_probe]
    vx, vy = float_images(vx[pick]), vy[pick]
    probe_at = {0, 1, 2, 5, 10, steps} | set(range(every, steps + 1, every))
    layers = _layers(model)
    probes = [{"step": 0, **_probe(model, vx, vy)}]
    losses, lrs, step, epoch = [], [], 0, 0
    while step < steps:
        if hasattr(loaders.train, "set_epoch"):
            loaders.train.set_epoch(epoch)
        for batch in loaders.train:
            model.train()
            out = objective(model, tuple(b.to(device) for b in batch), True)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            grads = {name: _rms(m) for name, m in layers}
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            if recipe.scheduler_step == "batch":
                scheduler.step()
            losses.append(out.loss.item())
            step += 1
            if step in probe_at:
                probes.append({"step": step, **_probe(model, vx, vy), "grad_rms": grads})
            if step >= steps:
                break
        epoch += 1
        if recipe.scheduler_step == "epoch":
            scheduler.step()
            if hasattr(objective, "set_epoch"):
                objective.set_epoch(epoch, recipe.epochs)
    if any(not math.isfinite(v) for v in losses):
        raise ValueError(f"{recipe.name}: a training loss was not finite in the first {steps} steps")
    return {
        "recipe": recipe.name,
        "config": recipe.config(),
        "steps": steps,
        "loss": losses,
        "lr": lrs,
        "probes": probes,
        "seconds": time.time() - t0,
    }


#: the columns of :func:`diagnosis_rows`
DIAGNOSIS_HEADERS = (
    "run",
    "loss, first 10 → last 10 steps",
    "val. acc. at the end (%)",
    "input activations (mean, share off)",
    "capsule lengths by layer (mean / spread over images / share above 0.99)",
    "RMS gradient by layer, image side first",
)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / max(1, len(values))


@checked
def diagnosis_rows(results: Mapping[str, dict[str, Any]]) -> list[list[str]]:
    """One table row per probed run of ``results`` (label -> :func:`first_steps`): the mean loss of the first and last
    ten steps, the probe accuracy at the end, the input activations (mean, share below 0.01) and capsule lengths
    (mean, spread over the images, share above 0.99) at the end (``-`` where the network has none) and the RMS
    gradient by layer, averaged over the probes after the first step."""
    rows = []
    for label, r in results.items():
        end = r["probes"][-1]
        act = end.get("activations")
        lengths = end.get("lengths")
        later = [p["grad_rms"] for p in r["probes"] if "grad_rms" in p]
        names = list(later[0]) if later else []
        grads = [_mean([g[n] for g in later]) for n in names]
        rows.append(
            [
                label,
                f"{_mean(r['loss'][:10]):.3f} → {_mean(r['loss'][-10:]):.3f}",
                f"{100 * end['val_acc']:.1f}",
                f"{act['mean']:.2g}, {act['off']:.0%}" if act else "-",
                "; ".join(f"{x['mean']:.2f} / {x['spread_over_images']:.2f} / {x['saturated']:.0%}" for x in lengths)
                if lengths
                else "-",
                ", ".join(f"{g:.0e}" for g in grads),
            ]
        )
    return rows
