"""The concept questions of the page on the reader's own images (see :mod:`.questions`): what the library decides
for a folder, what CapsNet's scores are, and two predictions revealed from the page's networks."""

from __future__ import annotations

import torch
from torch import nn

from ..cost import count_parameters
from ..evaluation import accuracy
from ..report import pct
from .quiz import Question, best_of, choices, ranked, rotate

#: the answer when the networks are equally accurate
SAME = "neither: the same accuracy"

#: CapsNet's parts by attribute, as the question names them (another part keeps its attribute's name)
PARTS = {
    "conv1": "the first convolution",
    "primary": "the primary capsules",
    "digits": "the class capsules' vote matrices",
    "decoder": "the decoder",
}


def own_images_questions(
    *, scores: dict[str, torch.Tensor], labels: torch.Tensor, capsnet: nn.Module
) -> list[Question]:
    """``scores``: network -> its scores ``[N, K]`` on the folder's test split; ``labels``: that split's labels
    ``[N]``; ``capsnet``: the CapsNet trained (or loaded) on the page."""
    acc = {name: accuracy(s.cpu(), labels.cpu()) for name, s in scores.items()}
    parts = {PARTS.get(name, name): count_parameters(m) for name, m in capsnet.named_children()}
    total = count_parameters(capsnet)
    best = max(acc.values())
    winner = next(k for k, v in acc.items() if v == best) if sum(v == best for v in acc.values()) == 1 else SAME
    return [
        Question(
            "Why does the library compute the normalisation statistics (per-channel mean and std) on the training "
            "split only?",
            rotate(
                choices(
                    "So that nothing measured on the validation and test images shapes what the network is trained on",
                    "Because the validation and test images are not normalised",
                    "Because only the training split has labels",
                    "To save time: the held-out images are read later",
                ),
                1,
            ),  # fmt: skip
            "The validation split chooses the epoch and the test split is used once, at the end; statistics taken "
            "from them would let those images leak into training. The training split's mean and std are recorded in "
            "the run, and a network that normalises its input (Tsai et al.'s) uses them on every split.",
        ),
        Question(
            "Your folder holds photographs of 400 × 300 pixels and the image size is 64. What happens to each one?",
            choices(
                "Its shorter side is resized to 64 and the middle 64 × 64 square kept",
                "It is stretched to 64 × 64",
                "It is padded to a square, then resized to 64 × 64",
                "It is refused: images must be square",
            ),  # fmt: skip
            "The shape is kept: the 300-pixel side becomes 64, the 400-pixel side 85, and the middle square is cut "
            "out (torchvision's resize, then center_crop); the one line of decisions counts the images this changed.",
        ),
        Question(
            "`predict(capsnet, ...)` returns the lengths of CapsNet's class capsules as its scores. Which is true?",
            rotate(
                choices(
                    "Each lies in [0, 1) and says how present its class is; they need not sum to 1",
                    "They sum to 1 over the classes, like a softmax",
                    "They are logits: any real number",
                    "Only the predicted class has a score above 0",
                ),
                2,
            ),  # fmt: skip
            "Each class capsule is squashed on its own and trained with the margin loss, so several classes can be "
            "long at once, or none; the prediction is the longest. The CNN's scores are logits, and its prediction "
            "their largest.",
        ),
        Question(
            "Predict: on the images held out of the folder for testing, which network is more accurate, the small "
            "CapsNet or the CNN trained with the same recipe?",
            ranked(winner, [*acc, SAME]),
            "Measured on this page: " + ", ".join(f"{k} {pct(v)}" for k, v in acc.items()) + f" of {len(labels)} "
            "test images.",
        ),
        Question(
            "Predict: which part of the small CapsNet holds the most parameters?",
            best_of(parts),
            "Measured on this page: "
            + ", ".join(f"{k} {n:,}" for k, n in parts.items())
            + f" of {total:,}. Parameters count weights, not work: a convolution shares its kernels over every "
            "position, while the decoder's last layer has a weight for each of its units and each pixel of every "
            "channel of the image it redraws.",
        ),
    ]
