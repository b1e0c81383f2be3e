"""The ONNX export of the live widgets' models (capsule_lib.export), checked with onnxruntime against PyTorch.

The shipped CapsNet and Efficient-CapsNet are exported once per module (about a minute on two cores); every test
image of the data path at hand (the real MNIST test set under CAPSULE_DATA, else the generated stand-in) goes
through both graphs and through PyTorch.
"""

import subprocess
import sys

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx", reason="the optional extra 'export' (onnx, onnxscript, onnxruntime)")
ort = pytest.importorskip("onnxruntime", reason="the optional extra 'export' (onnx, onnxscript, onnxruntime)")

from capsule_lib.data import get_dataset  # noqa: E402
from capsule_lib.export import (  # noqa: E402
    LIVE_MODELS,
    DecoderGraph,
    EncoderGraph,
    export_decoder,
    export_encoder,
    export_pretrained,
    weights_to_fp16,
)
from capsule_lib.models import CapsNet, CapsNetConfig  # noqa: E402
from capsule_lib.pretrained import load_pretrained  # noqa: E402

pytestmark = pytest.mark.slow
TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(16, 32))


def _session(path):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Both live models exported as the book exports them, and CapsNet's encoder also in float32."""
    d = tmp_path_factory.mktemp("onnx")
    out = {name: export_pretrained(name, d) for name in LIVE_MODELS}
    model, _ = load_pretrained("capsnet_mnist")
    out["capsnet_fp32"] = export_encoder(model, d / "fp32" / "capsnet_mnist.encoder.onnx", fp16=False)
    return out


@pytest.fixture(scope="module")
def test_images():
    """The test images of the data path at hand: real MNIST under CAPSULE_DATA, else the generated stand-in."""
    from conftest import REAL_DATA

    ds = get_dataset("mnist", REAL_DATA, split="test", offline=True, standin=True)
    return ds.images.float() / 255.0, ds.generated


def _batches(x, n=500):
    return [x[i : i + n] for i in range(0, len(x), n)]


@pytest.mark.parametrize("name", list(LIVE_MODELS))
def test_encoder_equals_pytorch_on_every_test_image(exported, test_images, name):
    images, _ = test_images
    model, _ = load_pretrained(name)
    graph, session = EncoderGraph(model).eval(), _session(exported[name].encoder)
    assert [o.name for o in session.get_outputs()] == ["poses", "lengths", "couplings"]
    worst, agree = [0.0, 0.0, 0.0], 0
    for x in _batches(images):
        with torch.no_grad():
            want = [t.numpy() for t in graph(x)]
        got = session.run(None, {"image": x.numpy()})
        for k, (a, b) in enumerate(zip(got, want)):
            assert a.shape == b.shape and a.dtype == np.float32
            worst[k] = max(worst[k], float(np.abs(a - b).max()))
        agree += int((got[1].argmax(1) == want[1].argmax(1)).sum())
    assert agree == len(images), f"{name}: {len(images) - agree} of {len(images)} predictions differ"
    assert max(worst) < 1e-4, f"{name}: max |onnx - torch| of poses, lengths, couplings: {worst}"


def test_the_encoder_graph_is_the_models_forward_and_its_couplings_sum_to_one():
    """EncoderGraph outputs what the model's forward outputs, and every iteration's couplings (T of them)."""
    model = CapsNet(TINY).eval()
    x = torch.rand(3, 1, 28, 28)
    with torch.no_grad():
        poses, lengths, couplings = EncoderGraph(model)(x)
        out = model(x, return_routing=True)
    assert torch.equal(poses, out.poses) and torch.equal(lengths, out.scores)
    assert couplings.shape == (3, 3, model.config.n_primary, 10)
    for t, c in enumerate(out.trace.coefficients):
        assert torch.equal(couplings[:, t], c)
    assert torch.allclose(couplings.sum(-1), torch.ones(3, 3, model.config.n_primary))


@pytest.mark.parametrize("name", list(LIVE_MODELS))
def test_decoder_equals_the_models_reconstruction(exported, name):
    model, _ = load_pretrained(name)
    session = _session(exported[name].decoder)
    x = torch.rand(4, 1, 28, 28)
    with torch.no_grad():
        out = model(x)
        want = model.reconstruct(out.poses, out.scores.argmax(1)).numpy()  # the longest capsule, as the widget
    label = out.scores.argmax(1)
    pose = out.poses[torch.arange(4), label]  # [4, 16]
    got = session.run(None, {"pose": pose.numpy(), "label": label.numpy()})[0]
    assert got.shape == (4, 1, 28, 28)
    assert np.abs(got - want).max() < 1e-5
    other = session.run(None, {"pose": pose.numpy(), "label": ((label + 1) % 10).numpy()})[0]
    assert np.abs(other - got).max() > 0.05  # the class decides which capsule slot the pose fills


def test_fp16_weights_halve_capsnet_and_change_nothing_it_predicts(exported, test_images):
    """CapsNet's encoder in float32 is over 20 MB; with fp16 weights it is about half, computed in float32, and it
    predicts the same class as the float32 file on every test image (lengths within 1e-3)."""
    fp32, fp16 = exported["capsnet_fp32"], exported["capsnet_mnist"].encoder
    assert fp32.stat().st_size > 20e6 and fp16.stat().st_size < 0.55 * fp32.stat().st_size
    images, _ = test_images
    a, b = _session(fp32), _session(fp16)
    assert b.get_inputs()[0].type == "tensor(float)" and all(o.type == "tensor(float)" for o in b.get_outputs())
    worst = 0.0
    for x in _batches(images[:1000]):
        la, lb = a.run(["lengths"], {"image": x.numpy()})[0], b.run(["lengths"], {"image": x.numpy()})[0]
        assert (la.argmax(1) == lb.argmax(1)).all()
        worst = max(worst, float(np.abs(la - lb).max()))
    assert worst < 1e-3


def test_weights_to_fp16_keeps_small_weights_and_float32_computation(tmp_path):
    model = CapsNet(TINY).eval()
    path = export_decoder(model, tmp_path / "d.onnx")
    proto = onnx.load(str(path))
    weights_to_fp16(proto, min_elements=64)
    kinds = {i.name: i.data_type for i in proto.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in kinds.values() and onnx.TensorProto.FLOAT in kinds.values()
    halves = [name for name, kind in kinds.items() if kind == onnx.TensorProto.FLOAT16]
    assert sorted(n.input[0] for n in proto.graph.node if n.op_type == "Cast" and n.input[0] in kinds) == sorted(halves)
    onnx.save(proto, str(tmp_path / "h.onnx"))
    pose, label = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32), np.array([1, 7])
    full = _session(path).run(None, {"pose": pose, "label": label})[0]
    half = _session(tmp_path / "h.onnx").run(None, {"pose": pose, "label": label})[0]
    assert half.dtype == np.float32 and 0 < np.abs(full - half).max() < 1e-2


def test_weights_are_embedded_and_the_batch_is_free(exported):
    """One self-contained file per graph (no external .data file), any batch size."""
    files = sorted(p.name for p in exported["capsnet_mnist"].encoder.parent.iterdir() if p.is_file())
    assert files == sorted(f"{n}.{g}.onnx" for n in LIVE_MODELS for g in ("encoder", "decoder"))
    e = exported["efficient_capsnet_mnist"]
    proto = onnx.load(str(e.encoder), load_external_data=False)
    assert all(i.data_location == onnx.TensorProto.DEFAULT for i in proto.graph.initializer)
    assert (e.iterations, e.n_classes, e.class_dim) == (1, 10, 16) and exported["capsnet_mnist"].iterations == 3
    session = _session(e.encoder)
    for b in (1, 7):
        poses, lengths, couplings = session.run(None, {"image": np.zeros((b, 1, 28, 28), np.float32)})
        assert poses.shape == (b, 10, 16) and lengths.shape == (b, 10) and couplings.shape == (b, 1, 16, 10)


def test_bad_arguments_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError, match="must be one of"):
        export_pretrained("em_norb", tmp_path)
    with pytest.raises(ValueError, match="no decoder"):
        DecoderGraph(CapsNet(TINY, decoder=False))
    assert not list(tmp_path.iterdir())


def test_import_capsule_lib_does_not_import_onnx():
    code = "import sys, capsule_lib, capsule_lib.notebook; print('onnx' in sys.modules or 'onnxscript' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
