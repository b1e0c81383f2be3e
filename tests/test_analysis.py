"""capsule_lib.analysis computes what the figures show; capsule_lib.viz only draws it.

The moved functions keep their tests where they were (test_viz.py, test_tsai_chapter.py, test_heinsen_chapter.py
...); here: the functions added for the explorers (they return what the explorers computed inline before) and the
check that no module of viz runs a model or a routing function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

from capsule_lib import analysis
from capsule_lib.models import CapsNet, CapsNetConfig, EMCapsNet, EMCapsNetConfig, SmallNORBClassifier

VIZ = Path(__file__).resolve().parents[1] / "capsule_lib" / "viz"

#: model methods that run (part of) a model
_RUNS = {"forward", "class_inputs", "route_classes", "class_credits", "reconstruct", "part_capsules", "route"}


def _computations(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of every model run, routing call, ``no_grad`` and import of routing/models in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(p in (node.module or "") for p in ("routing", "models")):
            found.append((node.lineno, f"imports {node.module}"))
        elif isinstance(node, ast.Attribute) and node.attr == "no_grad":
            found.append((node.lineno, "no_grad"))
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            method = isinstance(f, ast.Attribute) and name in _RUNS  # model.class_inputs(...), ...
            if name == "model" or method or name.endswith("_routing"):
                found.append((node.lineno, f"calls {ast.unparse(f)}"))
            found += [(node.lineno, "return_routing=") for k in node.keywords if k.arg == "return_routing"]
    return found


def test_no_viz_module_runs_a_model_or_a_routing_function():
    found = {p.name: hits for p in sorted(VIZ.glob("*.py")) if (hits := _computations(ast.parse(p.read_text())))}
    assert found == {}, f"computations in capsule_lib.viz (move them to capsule_lib.analysis): {found}"
    sample = "with torch.no_grad():\n    y = model(x, return_routing=True)\nz = em_routing(v)\nm.route_classes(p, a)\n"
    assert sorted(w for _, w in _computations(ast.parse(sample))) == [
        "calls em_routing",
        "calls m.route_classes",
        "calls model",
        "no_grad",
        "return_routing=",
    ]  # the detector works


def test_decode_poses_is_the_models_decoder_on_the_cpu():
    torch.manual_seed(0)
    model = CapsNet(CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))).eval()
    poses = torch.randn(3, 10, 8)
    recon = analysis.decode_poses(model, poses, 2)
    with torch.no_grad():
        want = model.reconstruct(poses, torch.full((3,), 2))
    assert recon.device.type == "cpu" and not recon.requires_grad
    torch.testing.assert_close(recon, want)


def test_em_class_trace_reroutes_the_class_layer():
    torch.manual_seed(0)
    cfg = EMCapsNetConfig(
        in_channels=2, image_size=20, conv_channels=8, primary_types=4, caps1_types=4, caps2_types=4, n_classes=5
    )
    model = EMCapsNet(cfg).eval()
    x = torch.rand(2, 2, 20, 20)
    poses, acts = analysis.em_class_inputs(model, x)
    as_uint8 = analysis.em_class_inputs(model, (x * 255).round().to(torch.uint8))
    assert as_uint8[0].shape == poses.shape
    with torch.no_grad():
        want_poses, want_acts = model.class_inputs(x)
        (_, a), want = model.route_classes(want_poses, want_acts, 2, cfg.final_lambda * 10.0)
    torch.testing.assert_close(poses, want_poses)
    trace = analysis.em_class_trace(model, poses, acts, 2, 10.0)
    assert trace.iterations == 2 and not trace.activations[-1].requires_grad
    torch.testing.assert_close(trace.activations[-1], want.activations[-1])
    own = analysis.em_class_trace(model, poses, acts)  # the model's own class layer
    assert own.iterations == cfg.iterations
    torch.testing.assert_close(own.activations[-1], model(x).scores.detach())


def test_class_credit_maps_per_iteration_and_per_image():
    torch.manual_seed(0)
    model = SmallNORBClassifier(image_size=None).eval()
    x = torch.randint(0, 256, (2, 2, 48, 48), dtype=torch.uint8)
    maps, probs = analysis.class_credit_maps(model, x)
    T = model.config.iterations
    assert maps.shape[:3] == (2, T, 5) and probs.shape == (2, 5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    with torch.no_grad():
        out, credits = model.class_credits(x.float() / 255, T - 1)
    torch.testing.assert_close(maps[:, -1], analysis.credit_maps(credits))
    torch.testing.assert_close(probs, out.scores.softmax(-1))
    one, p1 = analysis.class_credit_maps(model, x[1:])
    torch.testing.assert_close(one[0], maps[1], rtol=1e-4, atol=1e-5)  # an image's maps do not depend on the batch
    torch.testing.assert_close(p1[0], probs[1], rtol=1e-4, atol=1e-5)
