"""The chapters' exercises: every solution passes its check, every stub is 'not written yet', every named mistake is
recognised in a wrong implementation written here (as a reader would write it), the checker never crashes on what a
reader's function does, and the concept questions render as self-contained HTML with a text fallback."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import capsule_lib as cl
from capsule_lib.exercises import EXERCISES, QUESTIONS, Choice, ExerciseFailed, Question, Quiz, check, quiz
from capsule_lib.exercises.questions import questions_of
from capsule_lib.routing_critique import Measured

REPO = Path(__file__).resolve().parents[1]
BOOK = REPO / "book"
CHAPTERS = sorted({e.chapter for e in EXERCISES.values()})


def _cells(chapter: str, tag: str) -> list[str]:
    nb = json.loads((BOOK / f"{chapter}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if tag in c.get("metadata", {}).get("tags", [])]


def _defined(src: str) -> dict:
    """Execute a cell without its final check call; its namespace (the chapter's imports provided)."""
    ns = {"torch": torch, "cl": cl, "math": math}
    exec(src.rsplit("\ncheck(", 1)[0], ns)
    return ns


def _cell_of(name: str, tag: str) -> str:
    found = [s for s in _cells(EXERCISES[name].chapter, tag) if f'check("{name}", {name}' in s]
    assert len(found) == 1, (
        f"{name}: expected one {tag} cell in book/{EXERCISES[name].chapter}.ipynb, found {len(found)}"
    )
    return found[0]


# ---------------------------------------------------------------------------------- solutions and stubs
@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_solution_passes_its_check(name):
    src = _cell_of(name, "exercise-solution")
    assert src.rstrip().endswith(f'check("{name}", {name}, must_pass=True)'), "a solution cell must raise if it fails"
    result = check(name, _defined(src)[name])
    assert result.passed and result.status == "passed", str(result)


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_every_stub_says_not_written_yet(name):
    result = check(name, _defined(_cell_of(name, "exercise-stub"))[name])
    assert not result.passed and result.status == "todo", str(result)
    assert name in result.message


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_ends_with_questions_and_exercises(chapter):
    nb = json.loads((BOOK / f"{chapter}.ipynb").read_text())
    cells = nb["cells"]
    first = next(i for i, c in enumerate(cells) if c.get("id") == "ex-intro")
    assert all(str(c.get("id", "")).startswith("ex-") for c in cells[first:]), "the exercises close the chapter"
    quiz_cells = _cells(chapter, "exercise-quiz")
    assert len(quiz_cells) == 1 and f'quiz("{chapter}"' in quiz_cells[0]
    names = [e.name for e in EXERCISES.values() if e.chapter == chapter]
    assert 2 <= len(names) <= 4, names
    for c in cells[first:]:
        if "exercise-solution" in c["metadata"].get("tags", []):  # hidden on the page and in JupyterLab
            assert "hide-input" in c["metadata"]["tags"] and c["metadata"]["jupyter"]["source_hidden"] is True
    stubs = _cells(chapter, "exercise-stub")
    assert [re.search(r'check\("(\w+)"', s).group(1) for s in stubs] == names


def test_about_twenty_exercises_and_every_chapter_has_questions():
    assert 18 <= len(EXERCISES) <= 24
    toc_chapters = {p.stem for p in BOOK.glob("*.ipynb")} - {"results"}
    assert set(QUESTIONS) == toc_chapters == set(CHAPTERS)


def test_a_failing_solution_raises():
    with pytest.raises(ExerciseFailed, match="squash_hinton: differs"):
        check("squash_hinton", lambda s: 2 * s, must_pass=True)
    with pytest.raises(ValueError, match="name must be one of"):
        check("squash", lambda s: s)


# ----------------------------------------------------------------------- the checker never crashes
def _norm(s, keepdim=True):
    return torch.sqrt((s**2).sum(-1, keepdim=keepdim))


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda s: 1 / 0, "raised ZeroDivisionError: division by zero"),
        (lambda s: s.numpy(), "returned an object of type ndarray, expected a float32 tensor"),
        (lambda s: s.tolist(), "returned a list of 4, expected a float32 tensor of shape [4, 6, 8]"),
        (lambda s: "v", "returned an object of type str"),
        (lambda s: (s, s), "returned a tuple of 2, expected a float32 tensor"),
        (lambda s: s[..., :4], "has shape [4, 6, 4], expected [4, 6, 8]"),
        (lambda s: s * float("nan"), "has NaN in 192 of 192 entries where the reference is finite"),
        (lambda s: cl.squash_hinton(s).double(), "is float64, expected float32 (keep the input's dtype)"),
        (lambda s: cl.squash_hinton(s).detach(), "no gradient flows back to the inputs"),
        (lambda s, extra: s, "raised TypeError"),
        (torch.zeros(3), "expected a function, got a float32 tensor of shape [3]"),
    ],
)
def test_the_checker_answers_in_one_line_whatever_the_function_does(fn, words):
    result = check("squash_hinton", fn)
    assert not result.passed and words in result.message, result.message
    assert "\n" not in str(result) and result.status == "failed"


def test_a_function_that_modifies_its_input_in_place_does_not_change_the_cases():
    def in_place(s):
        s.mul_(0)
        return cl.squash_hinton(s)

    assert not check("squash_hinton", in_place).passed
    assert check("squash_hinton", cl.squash_hinton).passed


# ------------------------------------------------------------------ hangs, devices, in-place changes (issue #64)
def _forever(s):
    while True:
        pass


def _sleeps(s):
    time.sleep(20)
    return cl.squash_hinton(s)


@pytest.mark.parametrize("fn", [_forever, _sleeps], ids=["endless-loop", "sleeps"])
def test_a_function_that_never_returns_is_stopped_and_said(fn):
    """A function that never returned hung the checker forever."""
    from capsule_lib.exercises.catalogue import EXERCISES
    from capsule_lib.exercises.checker import run_exercise

    t0 = time.perf_counter()
    result = run_exercise(EXERCISES["squash_hinton"], fn, time_limit=0.5)
    assert time.perf_counter() - t0 < 5 and not result.passed
    assert "did not return within 0.5 s" in result.message and "\n" not in str(result), result.message
    assert check("squash_hinton", cl.squash_hinton).passed  # the alarm is gone afterwards


def test_the_time_limit_holds_off_the_main_thread_too():
    from capsule_lib.exercises.catalogue import EXERCISES
    from capsule_lib.exercises.checker import run_exercise

    out = {}
    worker = threading.Thread(target=lambda: out.update(r=run_exercise(EXERCISES["squash_hinton"], _sleeps, 0.5)))
    worker.start()
    worker.join(10)
    assert "did not return within 0.5 s" in out["r"].message


@pytest.mark.parametrize(
    "fn, words",
    [
        (lambda s: torch.empty_like(s, device="meta"), "is on the meta device, expected cpu"),
        (lambda s: cl.squash_hinton(s).to_sparse(), "is a sparse_coo tensor, expected a dense"),
        (lambda s: cl.squash_hinton(s).to(torch.complex64), "is complex64, expected float32"),
        (lambda s: cl.squash_hinton(s).to(torch.bool), "is bool, expected float32"),
    ],
    ids=["meta", "sparse", "complex", "bool"],
)
def test_any_device_or_dtype_returned_is_one_line(fn, words):
    """A tensor on the meta device made the checker raise, against its docstring."""
    result = check("squash_hinton", fn)
    assert not result.passed and words in result.message and "\n" not in str(result), result.message


def test_a_function_that_changes_its_input_in_place_is_named():
    """An in-place change of the input got a gradient error that did not say so."""

    def scales_in_place(s):
        n2 = (s**2).sum(-1, keepdim=True)
        s.mul_(torch.sqrt(n2) / (1 + n2))  # the right values, computed in the input's storage
        return s

    result = check("squash_hinton", scales_in_place)
    assert not result.passed and "changes its input 's' in place" in result.message, result.message


def test_the_verdict_is_shown_as_one_line_in_text_and_html():
    r = check("squash_hinton", cl.squash_hinton)
    assert str(r).startswith("✓ squash_hinton: right on all 5 cases and gradients (random capsules [4, 6, 8], zero")
    assert "capsule-check" in r._repr_html_() and "✓ squash_hinton" in r._repr_html_()
    assert str(check("squash_hinton", lambda s: None)).startswith("… squash_hinton: returns None")


# -------------------------------------------------------------------- every named mistake, recognised
def _softmax_dyn(votes, iterations, *, axis=2, detach=False, squash=None, update=True, agree_s=False, manual=False):
    squash = squash or cl.squash_hinton
    b = torch.zeros(votes.shape[:3], dtype=votes.dtype)
    for t in range(iterations):
        u = votes.detach() if detach and t < iterations - 1 else votes
        c = torch.exp(b) / torch.exp(b).sum(axis, keepdim=True) if manual else torch.softmax(b, axis)
        s = torch.einsum("bij,bijd->bjd", c, u)
        v = squash(s)
        if update:
            b = b + torch.einsum("bijd,bjd->bij", u, s if agree_s else v)
    return v


def _raw_squash(s):  # no epsilon
    n = s.norm(dim=-1, keepdim=True)
    return n**2 / (1 + n**2) * s / n


def _margin(x, y, mp=0.9, mn=0.1, lam=0.5, plam=1.0, p=2):
    T = F.one_hot(y, x.shape[1]).to(x.dtype)
    return T * plam * torch.relu(mp - x) ** p + lam * (1 - T) * torch.relu(x - mn) ** p


def _prim(h, n, perm):
    B, C, H, W = h.shape
    return h.view(B, n, C // n, H, W).permute(*perm).reshape(B, -1, C // n)


def _em_m(votes, a_in, R, bu, ba, lam, *, renorm=False, use_a=True, log2=False, mass_cost=True):
    Rp = R * a_in[..., None] if use_a else R.clone()
    if renorm:
        Rp = Rp / Rp.sum(-1, keepdim=True)
    m = Rp.sum(1)
    mu = torch.einsum("bij,bijd->bjd", Rp, votes) / m[..., None]
    var = torch.einsum("bij,bijd->bjd", Rp, (votes - mu[:, None]) ** 2) / m[..., None] + 1e-8
    cost = (bu[:, None] + (var.log() if log2 else 0.5 * var.log())) * (m[..., None] if mass_cost else 1)
    return mu, var, torch.sigmoid(lam * (ba - cost.sum(-1)))


def _em_e(votes, mu, var, a, *, dim=2, prior=True, half=0.5, log_sig=True, log_space=True):
    lp = -half * ((votes - mu[:, None]) ** 2 / var[:, None]).sum(-1)
    if log_sig:
        lp = lp - 0.5 * var.log().sum(-1)[:, None]
    if prior:
        lp = lp + a.log()[:, None]
    if not log_space:
        return lp.exp() / lp.exp().sum(dim, keepdim=True)
    return torch.softmax(lp, dim)


def _hm(a_inp, R, V, bu, bi, *, one=False, sig=True, f_use=True, ign=True, by_count=False):
    f = (torch.sigmoid(a_inp) if sig else a_inp)[..., None]
    Du = f * R if f_use else R
    Di = 1 - Du if one else f - Du
    a_out = (bu * Du).sum(1) - ((bi * Di).sum(1) if ign else 0)
    den = (torch.full_like(Du.sum(1), R.shape[1]) if by_count else Du.sum(1)) + 1e-5
    mu = torch.einsum("bij,bijce->bjce", Du, V) / den[..., None, None]
    var = torch.einsum("bij,bijce->bjce", Du, (V - mu[:, None]) ** 2) / den[..., None, None] + 1e-5
    return a_out, mu, var


def _he(a_out, V, mu, var, *, dim=2, prior="ls", log_sig=True):
    lp = -((V - mu[:, None]) ** 2 / (2 * var[:, None])).sum((-2, -1))
    if log_sig:
        lp = lp - 0.5 * var.log().sum((-2, -1))[:, None]
    p = {"ls": F.logsigmoid(a_out), "logit": a_out, "none": 0 * a_out}[prior]
    return torch.softmax(lp + p[:, None], dim)


def _inv(votes, prev=None, *, dim=2, scale=True, end="ln"):
    B, I, J, d = votes.shape
    r = (
        torch.full((B, I, J), 1 / J, dtype=votes.dtype)
        if prev is None
        else torch.softmax(torch.einsum("bijd,bjd->bij", votes, prev) / (d**0.5 if scale else 1), dim)
    )
    s = torch.einsum("bij,bijd->bjd", r, votes)
    return {"ln": F.layer_norm(s, (d,)), "none": s, "squash": cl.squash_hinton(s)}[end]


def _windows(p, k, s, *, stacked=False):
    B, N, H, W, D = p.shape
    h, w = (H - k) // s + 1, (W - k) // s + 1
    if not stacked:
        return p.unfold(2, k, s).unfold(3, k, s).permute(0, 1, 6, 5, 2, 3, 4)  # k and l swapped
    sl = [p[:, :, i * s : i * s + k, j * s : j * s + k] for i in range(h) for j in range(w)]  # [B, N, k, k, D] each
    return torch.stack(sl, -1).view(B, N, k, k, h, w, D)  # the official code's view


def _sa(v, b, *, dim=2, scale=True, inside=False):
    a = torch.einsum("bijd,bkjd->bij", v, v) / (v.shape[-1] ** 0.5 if scale else 1)
    return torch.softmax(a + b, dim) if inside else torch.softmax(a, dim) + b


def _ov(a, b, sa, sb, pad=4, *, merge="clip", roll=False, swap=False):
    def place(img, sh):
        img = F.pad(img, (pad,) * 4)
        out, S = torch.zeros_like(img), img.shape[-1]
        for n, (dx, dy) in enumerate(sh.tolist()):
            if swap:
                dx, dy = dy, dx
            if roll:
                out[n] = torch.roll(img[n], (dy, dx), (-2, -1))
            else:
                out[n, :, max(dy, 0) : S + min(dy, 0), max(dx, 0) : S + min(dx, 0)] = img[
                    n, :, max(-dy, 0) : S - max(dy, 0), max(-dx, 0) : S - max(dx, 0)
                ]
        return out

    A, Bm = place(a, sa), place(b, sb)
    return {
        "clip": lambda: (A.int() + Bm.int()).clamp(max=255).to(torch.uint8),
        "wrap": lambda: A + Bm,
        "mean": lambda: ((A.int() + Bm.int()) // 2).to(torch.uint8),
        "max": lambda: torch.max(A, Bm),
    }[merge]()


def _fgsm(model, x, y, eps, *, sign=1.0, use_sign=True, clamp=True):
    x = x.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(F.cross_entropy(model(x), y), x)
    out = x + sign * eps * (g.sign() if use_sign else g * x.shape[0])
    return (out.clamp(0, 1) if clamp else out).detach()


def _entropy(c, *, norm=True, safe=True, axis=-1, log=torch.log):
    c = c.transpose(1, 2) if axis == 1 else c
    lg = log(c.clamp_min(1e-30)) if safe else log(c)
    h = -(c * lg).sum(-1) / (math.log(c.shape[-1]) if norm else 1)
    return float(h.mean())


def _versus(a, sa, b, sb, *, se=None, k=2):
    se = se(sa, sb) if se else math.hypot(sa, sb)
    return "higher" if a - b > k * se else "lower" if b - a > k * se else "within noise"


def _stats(images, split, *, keep=lambda s: s == 0, dims=(0, 2, 3), correction=0, per_image=False):
    x = images[keep(split)]
    if per_image:
        return x.mean(dims), x.flatten(2).std(-1, correction=correction).mean(0)
    return x.mean(dims), x.std(dims, correction=correction)


def _names(poses, classes, *, score=lambda p: p.norm(dim=-1), axis=1):
    return [classes[int(k)] for k in score(poses).argmax(axis)]


WRONG = {
    ("squash_hinton", "no_epsilon"): _raw_squash,
    ("squash_hinton", "epsilon_outside_root"): lambda s: _norm(s) ** 2 / (1 + _norm(s) ** 2) * s / (_norm(s) + 1e-9),
    ("squash_hinton", "linear_factor"): lambda s: s / (1 + _norm(s)),
    ("squash_hinton", "squash_efficient"): lambda s: (1 - torch.exp(-_norm(s))) * s / torch.sqrt(_norm(s) ** 2 + 1e-9),
    ("squash_hinton", "wrong_axis"): lambda s: cl.squash_hinton(s.transpose(-1, -2)).transpose(-1, -2),
    ("squash_hinton", "unit_vectors"): lambda s: F.normalize(s, dim=-1),
    ("squash_efficient", "no_epsilon"): lambda s: (
        (1 - torch.exp(-s.norm(dim=-1, keepdim=True))) * s / s.norm(dim=-1, keepdim=True)
    ),
    ("squash_efficient", "epsilon_outside_root"): lambda s: (1 - 1 / torch.exp(_norm(s))) * s / (_norm(s) + 1e-7),
    ("squash_efficient", "squash_hinton"): lambda s: cl.squash_hinton(s),
    ("squash_efficient", "wrong_axis"): lambda s: cl.squash_efficient(s, dim=1),
    ("squash_efficient", "exp_not_inverse"): lambda s: torch.exp(-_norm(s)) * s / torch.sqrt(_norm(s) ** 2 + 1e-8),
    ("capsule_lengths", "sqrt_at_zero"): lambda v: torch.sqrt((v * v).sum(-1)),
    ("capsule_lengths", "squared"): lambda v: (v * v).sum(-1),
    ("capsule_lengths", "wrong_axis"): lambda v: torch.sqrt((v * v).sum(-2) + 1e-8),
    ("capsule_lengths", "keepdim"): lambda v: torch.sqrt((v * v).sum(-1, keepdim=True) + 1e-8),
    ("margin_loss", "official_mean"): lambda x, y: (0.5 * _margin(x, y, lam=0.5)).mean(),
    ("margin_loss", "mean_over_classes"): lambda x, y: _margin(x, y).mean(),
    ("margin_loss", "sum_over_batch"): lambda x, y: _margin(x, y).sum(),
    ("margin_loss", "lambda_on_present"): lambda x, y: _margin(x, y, lam=1.0, plam=0.5).sum(1).mean(),
    ("margin_loss", "no_square"): lambda x, y: _margin(x, y, p=1).sum(1).mean(),
    ("margin_loss", "softmax_lengths"): lambda x, y: _margin(x.softmax(1), y).sum(1).mean(),
    ("margin_loss", "swapped_margins"): lambda x, y: _margin(x, y, mp=0.1, mn=0.9).sum(1).mean(),
    ("dynamic_routing", "softmax_over_children"): lambda v, t=3: _softmax_dyn(v, t, axis=1),
    ("dynamic_routing", "detached_votes"): lambda v, t=3: _softmax_dyn(v, t, detach=True),
    ("dynamic_routing", "logits_never_updated"): lambda v, t=3: _softmax_dyn(v, t, update=False),
    ("dynamic_routing", "no_epsilon"): lambda v, t=3: _softmax_dyn(v, t, squash=_raw_squash),
    ("dynamic_routing", "softmax_overflow"): lambda v, t=3: _softmax_dyn(v, t, manual=True),
    ("dynamic_routing", "agreement_with_s"): lambda v, t=3: _softmax_dyn(v, t, agree_s=True),
    ("dynamic_routing", "squash_efficient"): lambda v, t=3: _softmax_dyn(v, t, squash=cl.squash_efficient),
    ("primary_capsules", "not_squashed"): lambda h, n: _prim(h, n, (0, 1, 3, 4, 2)),
    ("primary_capsules", "view_mixes_positions"): lambda h, n: cl.squash_hinton(
        h.reshape(h.shape[0], -1, h.shape[1] // n)
    ),
    ("primary_capsules", "position_major"): lambda h, n: cl.squash_hinton(_prim(h, n, (0, 3, 4, 1, 2))),
    ("primary_capsules", "dimension_major_channels"): lambda h, n: cl.squash_hinton(
        h.view(h.shape[0], h.shape[1] // n, n, *h.shape[2:])
        .permute(0, 2, 3, 4, 1)
        .reshape(h.shape[0], -1, h.shape[1] // n)
    ),
    ("mask_capsules", "ignores_label"): lambda v, y=None: (
        v * F.one_hot(v.norm(dim=-1).argmax(1), v.shape[1])[..., None]
    ),
    ("mask_capsules", "keeps_the_others"): lambda v, y=None: (
        v * (1 - F.one_hot(v.norm(dim=-1).argmax(1) if y is None else y, v.shape[1]))[..., None]
    ),
    ("mask_capsules", "largest_entry"): lambda v, y=None: (
        v * F.one_hot(v.max(-1).values.argmax(1) if y is None else y, v.shape[1])[..., None]
    ),
    ("mask_capsules", "selected_only"): lambda v, y=None: v[
        torch.arange(len(v)), v.norm(dim=-1).argmax(1) if y is None else y
    ],
    ("em_m_step", "activations_cancelled"): lambda *a: _em_m(*a, renorm=True),
    ("em_m_step", "log_variance_in_cost"): lambda *a: _em_m(*a, log2=True),
    ("em_m_step", "cost_without_mass"): lambda *a: _em_m(*a, mass_cost=False),
    ("em_e_step", "normalised_over_children"): lambda *a: _em_e(*a, dim=1),
    ("em_e_step", "no_parent_activation"): lambda *a: _em_e(*a, prior=False),
    ("em_e_step", "not_log_space"): lambda *a: _em_e(*a, log_space=False),
    ("em_e_step", "missing_half"): lambda *a: _em_e(*a, half=1.0),
    ("em_e_step", "missing_log_sigma"): lambda *a: _em_e(*a, log_sig=False),
    ("heinsen_m_step", "ignored_is_one_minus_used"): lambda *a: _hm(*a, one=True),
    ("heinsen_m_step", "scores_not_sigmoid"): lambda *a: _hm(*a, sig=False),
    ("heinsen_m_step", "no_f"): lambda *a: _hm(*a, f_use=False),
    ("heinsen_m_step", "no_ignore_term"): lambda *a: _hm(*a, ign=False),
    ("heinsen_m_step", "mean_over_inputs"): lambda *a: _hm(*a, by_count=True),
    ("heinsen_e_step", "over_inputs"): lambda *a: _he(*a, dim=1),
    ("heinsen_e_step", "logit_as_log_probability"): lambda *a: _he(*a, prior="logit"),
    ("heinsen_e_step", "no_prior"): lambda *a: _he(*a, prior="none"),
    ("heinsen_e_step", "missing_log_sigma"): lambda *a: _he(*a, log_sig=False),
    ("inverted_update", "softmax_over_children"): lambda v, p=None: _inv(v, p, dim=1),
    ("inverted_update", "no_scaling"): lambda v, p=None: _inv(v, p, scale=False),
    ("inverted_update", "no_layer_norm"): lambda v, p=None: _inv(v, p, end="none"),
    ("inverted_update", "squash_not_layer_norm"): lambda v, p=None: _inv(v, p, end="squash"),
    ("conv_windows", "official_expansion"): lambda p, k, s: _windows(p, k, s, stacked=True),
    ("conv_windows", "offsets_swapped"): lambda p, k, s: _windows(p, k, s),
    ("self_attention_couplings", "softmax_over_children"): lambda v, b: _sa(v, b, dim=1),
    ("self_attention_couplings", "no_scaling"): lambda v, b: _sa(v, b, scale=False),
    ("self_attention_couplings", "prior_inside_softmax"): lambda v, b: _sa(v, b, inside=True),
    ("multimnist_overlay", "uint8_wraps"): lambda *a: _ov(*a, merge="wrap"),
    ("multimnist_overlay", "averaged"): lambda *a: _ov(*a, merge="mean"),
    ("multimnist_overlay", "maximum"): lambda *a: _ov(*a, merge="max"),
    ("multimnist_overlay", "rolled"): lambda *a: _ov(*a, roll=True),
    ("multimnist_overlay", "shift_axes_swapped"): lambda *a: _ov(*a, swap=True),
    ("capsule_votes", "transposed_matrices"): lambda u, W: (W @ u[:, :, None, :, None]).squeeze(-1),
    ("capsule_votes", "summed_over_children"): lambda u, W: torch.einsum("bid,ijde->bje", u, W),
    ("capsule_votes", "one_matrix_per_parent"): lambda u, W: torch.einsum("bid,jde->bije", u, W[0]),
    ("loglog_slope", "no_logs"): lambda x, y: (
        float(torch.tensor([x, y], dtype=torch.float64).cov()[0, 1]) / float(torch.tensor(x, dtype=torch.float64).var())
    ),
    ("loglog_slope", "endpoints_only"): lambda x, y: math.log(y[-1] / y[0]) / math.log(x[-1] / x[0]),
    ("loglog_slope", "axes_swapped"): lambda x, y: cl.cost.loglog_slope(y, x),
    ("fgsm", "descends"): lambda m, x, y, e: _fgsm(m, x, y, e, sign=-1.0),
    ("fgsm", "no_sign"): lambda m, x, y, e: _fgsm(m, x, y, e, use_sign=False),
    ("fgsm", "not_clamped"): lambda m, x, y, e: _fgsm(m, x, y, e, clamp=False),
    ("reconstruction_distance", "squared"): lambda x, r: ((x - r) ** 2).sum((1, 2, 3)),
    ("reconstruction_distance", "mean_squared"): lambda x, r: F.mse_loss(x, r, reduction="none").mean((1, 2, 3)),
    ("reconstruction_distance", "one_number"): lambda x, r: torch.linalg.vector_norm(x - r),
    ("reconstruction_distance", "l1"): lambda x, r: (x - r).abs().sum((1, 2, 3)),
    ("coupling_entropy", "not_normalised"): lambda c: _entropy(c, norm=False),
    ("coupling_entropy", "zero_log_zero"): lambda c: _entropy(c, safe=False),
    ("coupling_entropy", "over_children"): lambda c: _entropy(c, axis=1),
    ("coupling_entropy", "bits_not_normalised"): lambda c: _entropy(c, norm=False, log=torch.log2),
    ("versus", "errors_added"): lambda *a: _versus(*a, se=lambda p, q: p + q),
    ("versus", "one_standard_error"): lambda *a: _versus(*a, k=1),
    ("versus", "one_error_only"): lambda *a: _versus(*a, se=lambda p, q: p),
    ("channel_stats", "all_splits"): lambda x, s: _stats(x, s, keep=lambda s: torch.ones_like(s, dtype=torch.bool)),
    ("channel_stats", "train_and_val"): lambda x, s: _stats(x, s, keep=lambda s: s != 2),
    ("channel_stats", "test_split"): lambda x, s: _stats(x, s, keep=lambda s: s == 2),
    ("channel_stats", "channels_last"): lambda x, s: _stats(x, s, dims=(0, 1, 2)),
    ("channel_stats", "one_number"): lambda x, s: (x[s == 0].mean(), x[s == 0].std(unbiased=False)),
    ("channel_stats", "unbiased_std"): lambda x, s: _stats(x, s, correction=1),
    ("channel_stats", "mean_of_image_stds"): lambda x, s: _stats(x, s, per_image=True),
    ("predicted_classes", "largest_entry"): lambda p, c: _names(p, c, score=lambda p: p.max(-1).values),
    ("predicted_classes", "over_the_batch"): lambda p, c: _names(p, c, axis=0),
    ("predicted_classes", "indices_not_names"): lambda p, c: torch.linalg.vector_norm(p, dim=-1).argmax(-1),
}


def test_leaving_out_the_activations_is_the_same_mistake_as_renormalising_them():
    assert check("em_m_step", lambda *a: _em_m(*a, use_a=False)).mistake == "activations_cancelled"


def test_every_named_mistake_has_a_wrong_implementation_here():
    named = {(e.name, m.key) for e in EXERCISES.values() for m in e.mistakes}
    assert set(WRONG) == named, {"untested": sorted(named - set(WRONG)), "unknown": sorted(set(WRONG) - named)}


@pytest.mark.parametrize("name, key", sorted(WRONG), ids=lambda x: x)
def test_the_checker_names_each_mistake(name, key):
    result = check(name, WRONG[(name, key)])
    message = next(m.message for m in EXERCISES[name].mistakes if m.key == key)
    assert not result.passed and result.mistake == key, str(result)
    assert result.message.startswith(message) and "\n" not in result.message


# ------------------------------------------------------------------------------------- the questions
def test_a_quiz_is_self_contained_html_with_a_text_fallback():
    q = Quiz(
        "Check",
        [
            Question("Pick `b`", (Choice("a"), Choice("b", True, "yes")), "because"),
            Question("How many?", answer=3.0, tolerance=0.5, unit="capsules", explanation="three"),
        ],
    )
    page = q._repr_html_()
    assert page.count('class="cq-question"') == 2 and "<code>b</code>" in page
    assert 'data-correct="1"' in page and 'data-answer="3.0"' in page and "<script>" in page
    assert not re.search(r"(https?:)?//[\w.-]+\.\w+/", page), "a quiz must load nothing from the network"
    assert "document.currentScript" in page and " id=" not in page
    text = repr(q)
    assert (
        "1. Pick `b`" in text and "   b) b" in text and "1. b: because" in text and "2. 3 capsules (within 0.5)" in text
    )


def test_questions_are_checked():
    with pytest.raises(ValueError, match="exactly one correct choice"):
        Question("?", (Choice("a"), Choice("b")))
    with pytest.raises(ValueError, match="either choices or a numeric answer"):
        Question("?")
    with pytest.raises(ValueError, match="at least one question"):
        Quiz("t", [])
    with pytest.raises(ValueError, match="chapter must be one of"):
        quiz("results")
    with pytest.raises(
        TypeError, match=r"quiz\('primer'\) takes the measurements \['v', 'sweep'\]; missing \['sweep'\]"
    ):
        quiz("primer", v=torch.zeros(1, 2, 2))
    with pytest.raises(TypeError, match=r"unknown \['w'\]"):
        quiz("robustness", curves={}, w=1)


class _History:
    def __init__(self, acc):
        self.records = [{"val_acc": acc}]


class _Curve:
    def __init__(self, acc):
        self.acc = acc

    def at(self, eps):
        return self.acc


class _Changes:
    def __init__(self, frac):
        self.changed_from_first = (0.0, frac)


def _sweep(accs, setting=None):
    return [
        {"iterations": t, "accuracy": a, **({"setting": setting} if setting else {})} for t, a in enumerate(accs, 1)
    ]


#: a CapsNet whose primary capsules hold the most parameters (5,192 of 9,856; the decoder 3,744)
_TINY_CAPSNET = dict(image_size=20, conv_channels=8, primary_types=2, primary_dim=4, n_classes=2, class_dim=4,
                     decoder_hidden=(8, 8))  # fmt: skip
MEASURED = {
    "primer": dict(
        v=torch.tensor([[[0.9, 0.0], [0.0, 0.5]]]),
        sweep={"n_outliers": [0, 12], "lengths": torch.tensor([0.2, 0.4]).expand(2, 2, 2, 2).numpy()},
    ),
    "dynamic_routing": dict(entropy=[2.3026, 2.29, 2.28], axis_runs={"parents": (_History(0.9), None),
                                                                     "children": (_History(0.5), None)}),
    "em_routing": dict(
        naive={"fp16 votes": {"naive_nonfinite": 1.0, "log_space_nonfinite": 0.0}},
        results={"a": {"drop": 0.1}, "b": {"drop": 0.3}},
        runs={"EM capsules": ["a"], "CNN": ["b"]},
    ),
    "heinsen_routing": dict(results={"a": {"novel": 0.8}, "b": {"novel": 0.7}}, runs={"H": ["a"], "CNN": ["b"]},
                            sequence_accuracy=0.995),
    "tsai_inverted": dict(sweep=_sweep([0.5, 0.6, 0.61, 0.62], "concurrent"), trained_iterations=2,
                          accuracy_unfold=0.6, accuracy_official=0.2),
    "efficient_capsnet": dict(step_seconds={"CapsNet": 1.0, "Efficient-CapsNet": 0.1}, both_correct=0.1),
    "routing_compared": dict(
        results={"dynamic": {"model": "dynamic", "accuracy": 0.98}, "cnn": {"model": "plain CNN", "accuracy": 0.99}},
        sweeps={"dynamic": _sweep([0.97, 0.98, 0.99, 0.99, 0.99])},
        trained={"dynamic": 3},
    ),
    "robustness": dict(curves={"CNN": {"BIM": _Curve(0.6)}, "CapsNet": {"BIM": _Curve(0.2)}}),
    "routing_critique": dict(
        summary={"mnist": {"dynamic_routed": {"test_acc": Measured(0.99, 0.001, (0.99, 0.99))},
                           "dynamic_uniform": {"test_acc": Measured(0.95, 0.001, (0.95, 0.95))}}},
        changes={"dynamic": _Changes(0.01), "EM": _Changes(0.2)},
    ),
    "own_images": dict(scores={"CapsNet (small)": torch.tensor([[0.9, 0.1], [0.2, 0.7], [0.6, 0.3]]),
                               "CNN": torch.tensor([[2.0, -1.0], [1.0, 0.0], [1.0, 0.0]])},
                       labels=torch.tensor([0, 1, 1]), capsnet=cl.CapsNet(**_TINY_CAPSNET)),
}  # fmt: skip
EXPECTED = {  # the text of the right choice of each chapter's predict questions, from the measurements above
    "primer": ["A", "no"],
    "dynamic_routing": ["0.01 to 0.1 nats", "parents"],
    "em_routing": ["nearly all or all (90 % or more)", "EM capsules"],
    "heinsen_routing": ["H", "99 % or more"],
    "tsai_inverted": ["higher", "yes"],
    "efficient_capsnet": ["5× to 20×", "under 20 %"],
    "routing_compared": ["plain CNN", "0"],
    "robustness": ["CNN"],
    "routing_critique": ["higher", "EM"],
    "own_images": ["CapsNet (small)", "the primary capsules"],
}


@pytest.mark.parametrize("chapter", sorted(QUESTIONS))
def test_each_chapter_has_three_to_six_questions_whose_predictions_come_from_its_measurements(chapter):
    qs = questions_of(chapter, **MEASURED[chapter])
    assert 3 <= len(qs) <= 6
    predict = [q for q in qs if q.text.startswith("Predict")]
    assert [next(c.text for c in q.choices if c.correct) for q in predict] == EXPECTED[chapter]
    assert all("Measured" in q.explanation for q in predict)
    assert all(q.explanation for q in qs)
    quiz(chapter, **MEASURED[chapter])._repr_html_()


def test_a_tie_at_the_top_is_one_choice():
    qs = questions_of("robustness", curves={"CNN": {"BIM": _Curve(0.5)}, "EM": {"BIM": _Curve(0.5)},
                                            "dynamic": {"BIM": _Curve(0.2)}})  # fmt: skip
    assert [(c.text, c.correct) for c in qs[-1].choices] == [("CNN / EM", True), ("dynamic", False)]


def test_equally_accurate_networks_are_the_answer_neither():
    scores = {"CapsNet (small)": torch.tensor([[0.9, 0.1], [0.2, 0.7]]), "CNN": torch.tensor([[1.0, 0.0], [0.0, 1.0]])}
    qs = questions_of("own_images", scores=scores, labels=torch.tensor([0, 1]), capsnet=cl.CapsNet(**_TINY_CAPSNET))
    assert [(c.text, c.correct) for c in qs[3].choices] == [
        ("CapsNet (small)", False),
        ("CNN", False),
        ("neither: the same accuracy", True),
    ]
    assert "CapsNet (small) 100.00 %, CNN 100.00 % of 2 test images" in qs[3].explanation


def test_the_normalisation_exercise_answers_what_the_library_records_for_a_dataset():
    from capsule_lib.data import get_dataset, image_facts, register_images

    g = torch.Generator().manual_seed(0)
    x = (torch.rand(30, 3, 6, 6, generator=g) * torch.linspace(0.2, 1.0, 30)[:, None, None, None] * 255).byte()
    name = register_images("exercise_channel_stats", x, torch.arange(30) % 3, ["a", "b", "c"])
    facts, train = image_facts(name), get_dataset(name, split="train")
    mean, std = _defined(_cell_of("channel_stats", "exercise-solution"))["channel_stats"](
        train.float_images(), torch.zeros(len(train), dtype=torch.long)
    )
    assert torch.allclose(mean, torch.tensor(facts.mean), atol=1e-4)
    assert torch.allclose(std, torch.tensor(facts.std), atol=1e-4)
