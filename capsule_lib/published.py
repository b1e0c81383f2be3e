"""Published results: the papers' numbers and the best public re-implementations', as data.

One :class:`PublishedResult` per (task, model, source), in :data:`PUBLISHED`. Accuracies are test accuracies in
percent; where a source states a test *error*, the accuracy is 100 minus it, with the source's precision, and
``stated`` says what the source wrote. Where each number comes from:

* **Sabour et al. 2017** (``sabour2017dynamic``), Table 1 (test error, mean ± std of 3 trials): MNIST, CapsNet
  with 3 routing iterations and the reconstruction loss 0.25 ± 0.005 %, the baseline CNN 0.39 %; MultiMNIST,
  CapsNet 5.2 %. Section 7 (other data sets): smallNORB 2.7 %, CIFAR-10 10.6 % (an ensemble of 7 models). Section
  5.2: affNIST 79 % accuracy (the baseline CNN 66 %) for models trained on translated MNIST digits.
* **Hinton et al. 2018** (``hinton2018matrix``): smallNORB test error 1.8 % (the standard split: every viewpoint is
  seen in training).
* **Heinsen 2019** (``heinsen2019algorithm``): smallNORB test accuracy 99.1 % (paper and the author's repository
  README; 10 runs per model, each tested at its lowest-validation-error snapshot).
* **Tsai et al. 2020** (``tsai2020capsules``): the official repository's README (apple/ml-capsules-inverted-
  attention-routing): CIFAR-10, resnet backbone, 2 routing iterations, 94.85 % mean of their runs and 95.14 % best
  (the number of runs is not stated; the official code selects its checkpoint on the test set).
* **Mazzia et al. 2021** (``mazzia2021efficient``), Table 2 (MNIST test error): the paper's reference capsule network
  "Base-CapsNet" (183 K parameters) 0.39–0.54 % and "Our baseline" CNN (173 K) 0.40–0.48 %, the ranges over the
  table's variants with and without reconstruction. Efficient-CapsNet's own MNIST figure is not listed here: it has
  not been checked against the paper.
* **Re-implementations**, each repository's README: gram-ai/capsule-networks 99.7 % (its best epoch, 443, chosen on
  the test set); acburigo/CapsNet 99.68 % (the maximum over epochs); XifengGuo/CapsNet-Pytorch 0.34 % average test
  error over 3 trials of 50 epochs (99.66 %); yl-1993/Matrix-Capsules-EM-PyTorch, EM routing: smallNORB 90.03 %
  (images resized to 48 and cropped to 32), MNIST 99.3 % (best).

The chapters quote the same numbers (``tests/test_results_page.py`` checks that every ``cite`` is a key of
``references.bib`` or an ``https://`` address).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PublishedResult", "PUBLISHED", "published", "REPOSITORIES"]

#: the public repositories quoted, by the name the tables use
REPOSITORIES = {
    "gram-ai/capsule-networks": "https://github.com/gram-ai/capsule-networks",
    "acburigo/CapsNet": "https://github.com/acburigo/CapsNet",
    "XifengGuo/CapsNet-Pytorch": "https://github.com/XifengGuo/CapsNet-Pytorch",
    "yl-1993/Matrix-Capsules-EM-PyTorch": "https://github.com/yl-1993/Matrix-Capsules-EM-PyTorch",
    "apple/ml-capsules-inverted-attention-routing": "https://github.com/apple/ml-capsules-inverted-attention-routing",
}


@dataclass(frozen=True)
class PublishedResult:
    """One published test accuracy.

    Attributes
    ----------
    task
        The data set it was measured on: ``"mnist"``, ``"multimnist"``, ``"affnist"``, ``"smallnorb"`` or
        ``"cifar10"``.
    model
        The network, as the source names it (``"CapsNet"``, ``"EM capsules"``, ...).
    accuracy
        Test accuracy in percent (100 minus the stated error where the source gives an error).
    decimals
        Decimals the source gives; the accuracy is shown with as many.
    stated
        What the source states, e.g. ``"0.25 ± 0.005 % test error, 3 trials"``.
    source
        ``"paper"``, ``"authors' code"`` (the official repository) or ``"re-implementation"``.
    by
        Who: ``"Sabour et al. 2017"`` or the repository's ``owner/name``.
    cite
        A key of ``references.bib`` (papers) or the repository's ``https://`` address.
    where
        Where in the source: ``"Table 1"``, ``"README"``, ...
    accuracy_max
        The upper end where the source gives a range (else ``None``).
    note
        What to keep in mind when comparing (protocol, model selection).
    """

    task: str
    model: str
    accuracy: float
    decimals: int
    stated: str
    source: str
    by: str
    cite: str
    where: str
    accuracy_max: float | None = None
    note: str = ""

    @property
    def text(self) -> str:
        """The accuracy as the tables show it, e.g. ``"99.75 %"`` or ``"99.46–99.61 %"`` (a non-breaking space
        before the ``%``)."""
        low = f"{self.accuracy:.{self.decimals}f}"
        high = f"–{self.accuracy_max:.{self.decimals}f}" if self.accuracy_max is not None else ""
        return f"{low}{high}\u00a0%"


_SABOUR = {"by": "Sabour et al. 2017", "cite": "sabour2017dynamic", "source": "paper"}
_MAZZIA = {"by": "Mazzia et al. 2021", "cite": "mazzia2021efficient", "source": "paper", "where": "Table 2"}


def _repo(name: str) -> dict[str, str]:
    return {"by": name, "cite": REPOSITORIES[name], "source": "re-implementation", "where": "README"}


#: every published number the book quotes, papers first, then re-implementations
PUBLISHED: tuple[PublishedResult, ...] = (
    PublishedResult(
        "mnist",
        "CapsNet",
        99.75,
        2,
        "0.25 ± 0.005 % test error, 3 trials",
        where="Table 1",
        note="3 routing iterations, with the reconstruction loss",
        **_SABOUR,
    ),
    PublishedResult(
        "mnist",
        "baseline CNN",
        99.61,
        2,
        "0.39 % test error",
        where="Table 1",
        note="3 convolutions of 256, 256, 128 channels and 2 hidden layers (35.4 M parameters)",
        **_SABOUR,
    ),
    PublishedResult(
        "multimnist",
        "CapsNet",
        94.8,
        1,
        "5.2 % test error (baseline CNN 8.1 %)",
        where="Table 1",
        note="trained and tested on overlapping pairs of digits",
        **_SABOUR,
    ),
    PublishedResult(
        "affnist",
        "CapsNet",
        79,
        0,
        "79 % (baseline CNN 66 %)",
        where="Section 5.2",
        note="trained on translated MNIST digits only",
        **_SABOUR,
    ),
    PublishedResult("smallnorb", "CapsNet", 97.3, 1, "2.7 % test error", where="Section 7", **_SABOUR),
    PublishedResult(
        "cifar10", "CapsNet", 89.4, 1, "10.6 % test error", where="Section 7", note="an ensemble of 7 models", **_SABOUR
    ),
    PublishedResult(
        "smallnorb",
        "EM capsules",
        98.2,
        1,
        "1.8 % test error",
        "paper",
        "Hinton et al. 2018",
        "hinton2018matrix",
        "smallNORB results",
        note="310 K parameters; standard split (all viewpoints)",
    ),
    PublishedResult(
        "smallnorb",
        "Heinsen's smallNORB network",
        99.1,
        1,
        "99.1 % test accuracy",
        "paper",
        "Heinsen 2019",
        "heinsen2019algorithm",
        "paper and README",
        note="271,688 parameters, 96×96 images; 10 runs per model; standard split",
    ),
    PublishedResult(
        "cifar10",
        "inverted attention routing, resnet backbone",
        94.85,
        2,
        "94.85 % mean, 95.14 % best, 2 routing iterations",
        "authors' code",
        "Tsai et al. 2020",
        REPOSITORIES["apple/ml-capsules-inverted-attention-routing"],
        "README",
        note="the number of runs is not stated; the official code keeps its best test-set epoch",
    ),
    PublishedResult(
        "mnist",
        "Base-CapsNet",
        99.46,
        2,
        "0.39–0.54 % test error",
        accuracy_max=99.61,
        note="the paper's reference capsule network (183 K parameters); with and without reconstruction",
        **_MAZZIA,
    ),
    PublishedResult(
        "mnist",
        "baseline CNN (Mazzia et al.)",
        99.52,
        2,
        "0.40–0.48 % test error",
        accuracy_max=99.60,
        note="173 K parameters; with and without reconstruction",
        **_MAZZIA,
    ),
    PublishedResult(
        "mnist",
        "CapsNet",
        99.7,
        1,
        "99.7 % (best epoch, 443)",
        note="epoch chosen on the test set; routing softmax over the children",
        **_repo("gram-ai/capsule-networks"),
    ),
    PublishedResult(
        "mnist",
        "CapsNet",
        99.68,
        2,
        "99.68 % (maximum over epochs)",
        note="test images randomly cropped",
        **_repo("acburigo/CapsNet"),
    ),
    PublishedResult(
        "mnist",
        "CapsNet",
        99.66,
        2,
        "0.34 % average test error, 3 trials, 50 epochs",
        note="best of the 3 trials: 0.30 % error",
        **_repo("XifengGuo/CapsNet-Pytorch"),
    ),
    PublishedResult(
        "smallnorb",
        "EM capsules",
        90.03,
        2,
        "90.03 %",
        note="images resized to 48×48 and cropped to 32×32",
        **_repo("yl-1993/Matrix-Capsules-EM-PyTorch"),
    ),
    PublishedResult("mnist", "EM capsules", 99.3, 1, "99.3 % (best)", **_repo("yl-1993/Matrix-Capsules-EM-PyTorch")),
)


def published(task: str | None = None, model: str | None = None, source: str | None = None) -> list[PublishedResult]:
    """The entries of :data:`PUBLISHED` for a task, a model and a source (``None``: any), in their order."""
    return [
        r
        for r in PUBLISHED
        if (task is None or r.task == task)
        and (model is None or r.model == model)
        and (source is None or r.source == source)
    ]
