"""ONNX export of trained capsule networks: the graphs the book's live widgets run in the reader's browser.

Each classifier is exported as two graphs, weights embedded in the file (no external ``.data`` file):

* the **encoder**, ``image [B, C, H, W] -> poses [B, K, D], lengths [B, K], couplings [B, T, n_inp, K]``: the class
  capsules, their lengths and the coupling coefficients of every routing iteration (``T`` of them; 3 for
  CapsNet's dynamic routing, 1 for Efficient-CapsNet's self-attention routing);
* the **decoder**, ``pose [B, D], label [B] (int64) -> image [B, C, H, W]``: the reconstruction from one class
  capsule, every other capsule masked to zero (what the models' ``reconstruct`` does with a label).

The arithmetic stays in the graphs; a page only feeds them. ``fp16=True`` stores every large weight in half
precision with a ``Cast`` back to float32 in front of its first use (the file halves, the computation stays
float32: CapsNet's encoder is 27 MB in float32, 14 MB so).

Needs the optional extra ``export`` (``pip install -e .[export]``: ``onnx``, ``onnxscript``, and ``onnxruntime``
for the checks); ``import capsule_lib`` never imports this module.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ._checks import check_choice
from ._contracts import checked
from .functional import capsule_lengths
from .pretrained import load_pretrained

__all__ = [
    "LIVE_MODELS",
    "FP16_MIN_ELEMENTS",
    "EncoderGraph",
    "DecoderGraph",
    "ExportedModel",
    "export_encoder",
    "export_decoder",
    "export_pretrained",
    "weights_to_fp16",
]

#: the shipped checkpoints the live widgets run, with the weight storage each page gets (CapsNet's encoder in
#: float32 is 27 MB: its weights are stored as fp16, computed in float32)
LIVE_MODELS: dict[str, bool] = {"capsnet_mnist": True, "efficient_capsnet_mnist": False}

#: weights smaller than this (elements) stay float32 under ``fp16=True`` (biases, norms: a Cast would cost more)
FP16_MIN_ELEMENTS = 1024


def _onnx():
    try:
        import onnx
    except ImportError:  # the optional extra
        raise ImportError("ONNX export needs the optional extra: pip install -e '.[export]'") from None
    return onnx


class EncoderGraph(nn.Module):
    """What the encoder graph computes: images -> class capsules, their lengths, every iteration's couplings.

    Parameters
    ----------
    model : nn.Module
        A trained :class:`~capsule_lib.models.capsnet.CapsNet` or
        :class:`~capsule_lib.models.efficient.EfficientCapsNet` (anything with ``primary_capsules``, a routing
        layer ``digits`` and a ``config``).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``image [B, C, H, W]`` in [0, 1] -> ``poses [B, K, D]``, ``lengths [B, K]``, ``couplings [B, T, I, K]``."""
        u = self.model.primary_capsules(image)  # [B, n_inp, d_inp]
        v, trace = self.model.digits(u, return_routing=True)  # [B, K, D]
        eps = getattr(self.model.config, "length_eps", None)
        lengths = capsule_lengths(v) if eps is None else capsule_lengths(v, eps=eps)  # [B, K]
        couplings = torch.stack(trace.coefficients, dim=1)  # [B, T, n_inp, K]
        return v, lengths, couplings


class DecoderGraph(nn.Module):
    """What the decoder graph computes: one class capsule's pose and its class -> the reconstruction.

    Parameters
    ----------
    model : nn.Module
        A trained model with a ``decoder`` (``config.n_classes`` class capsules).
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if getattr(model, "decoder", None) is None:
            raise ValueError(f"model: this {type(model).__name__} has no decoder; build it with one to export it")
        self.decoder = model.decoder
        self.register_buffer("classes", torch.arange(model.config.n_classes), persistent=False)  # [K]

    def forward(self, pose: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        """``pose [B, D]``, ``label [B]`` (int64) -> ``image [B, C, H, W]``, every other capsule zero."""
        mask = (self.classes.unsqueeze(0) == label.unsqueeze(1)).to(pose.dtype)  # [B, K]
        return self.decoder(mask.unsqueeze(-1) * pose.unsqueeze(1))  # [B, K, D] -> [B, C, H, W]


def weights_to_fp16(model_proto, min_elements: int = FP16_MIN_ELEMENTS):
    """Store an ONNX model's large float32 weights as float16, each cast back to float32 where it is read.

    Parameters
    ----------
    model_proto : onnx.ModelProto
        The model (changed in place and returned).
    min_elements : int, optional
        Weights with fewer elements stay float32 (default :data:`FP16_MIN_ELEMENTS`).

    Returns
    -------
    onnx.ModelProto
        The same model: inputs, outputs and every computation still float32.
    """
    onnx = _onnx()
    from onnx import TensorProto, helper, numpy_helper

    graph, casts = model_proto.graph, []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT:
            continue
        w = numpy_helper.to_array(init)
        if w.size < min_elements:
            continue
        name = init.name
        init.CopyFrom(numpy_helper.from_array(w.astype("float16"), name + "_fp16"))
        casts.append(helper.make_node("Cast", [name + "_fp16"], [name], to=TensorProto.FLOAT, name=name + "_cast"))
    for vi in [v for v in graph.value_info if v.name in {c.output[0] for c in casts}]:
        graph.value_info.remove(vi)
    nodes = casts + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model_proto)
    return model_proto


def _save(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str], fp16: bool) -> Path:
    onnx = _onnx()
    batch = torch.export.Dim("batch", min=1, max=1024)
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")  # its notes on axis names
        program = torch.onnx.export(
            module,
            args,
            None,
            input_names=inputs,
            output_names=outputs,
            dynamic_shapes=tuple({0: batch} for _ in args),
            dynamo=True,
            optimize=True,
            verbose=False,
        )
    proto = program.model_proto
    if fp16:
        proto = weights_to_fp16(proto)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    onnx.save_model(proto, str(tmp), save_as_external_data=False)
    os.replace(tmp, path)
    return path


@checked
def export_encoder(model: nn.Module, path: str | os.PathLike, fp16: bool = False) -> Path:
    """Export a model's encoder (:class:`EncoderGraph`) to one ONNX file, weights embedded.

    Parameters
    ----------
    model : nn.Module
        A CapsNet or Efficient-CapsNet (put in eval mode and on the CPU here).
    path : str or os.PathLike
        The ``.onnx`` file to write (folders made; written whole or not at all).
    fp16 : bool, optional
        Store large weights as float16 (:func:`weights_to_fp16`; default ``False``).

    Returns
    -------
    Path
        The file: input ``image [B, C, H, W]``; outputs ``poses [B, K, D]``, ``lengths [B, K]``,
        ``couplings [B, T, n_inp, K]``.
    """
    model = model.cpu().eval()
    c = model.config
    example = torch.rand(2, c.in_channels, c.image_size, c.image_size)
    return _save(EncoderGraph(model), (example,), Path(path), ["image"], ["poses", "lengths", "couplings"], fp16)


@checked
def export_decoder(model: nn.Module, path: str | os.PathLike, fp16: bool = False) -> Path:
    """Export a model's decoder (:class:`DecoderGraph`) to one ONNX file, weights embedded.

    Parameters
    ----------
    model : nn.Module
        A CapsNet or Efficient-CapsNet with a decoder.
    path : str or os.PathLike
        The ``.onnx`` file to write.
    fp16 : bool, optional
        Store large weights as float16 (default ``False``).

    Returns
    -------
    Path
        The file: inputs ``pose [B, D]`` and ``label [B]`` (int64); output ``image [B, C, H, W]``.
    """
    model = model.cpu().eval()
    graph = DecoderGraph(model)
    example = (torch.randn(2, model.config.class_dim), torch.tensor([0, 1]))
    return _save(graph, example, Path(path), ["pose", "label"], ["image"], fp16)


@dataclass
class ExportedModel:
    """One shipped checkpoint exported: its two files and what a page needs to know about them.

    Attributes
    ----------
    name : str
        The shipped checkpoint's name.
    encoder : Path
        The encoder's ONNX file, ``<name>.encoder.onnx``.
    decoder : Path
        The decoder's ONNX file, ``<name>.decoder.onnx``.
    fp16 : bool
        Whether large weights are stored as float16.
    n_classes : int
        The class capsules.
    class_dim : int
        Their dimension.
    image_size : int
        The side of the square input images.
    iterations : int
        The routing iterations whose couplings the encoder outputs.
    """

    name: str
    encoder: Path
    decoder: Path
    fp16: bool
    n_classes: int
    class_dim: int
    image_size: int
    iterations: int

    @property
    def nbytes(self) -> int:
        """Bytes of both files."""
        return self.encoder.stat().st_size + self.decoder.stat().st_size


@checked
def export_pretrained(name: str, directory: str | os.PathLike, fp16: bool | None = None) -> ExportedModel:
    """Export a shipped checkpoint's encoder and decoder into a folder.

    Parameters
    ----------
    name : str
        A shipped checkpoint the widgets know (:data:`LIVE_MODELS`: ``"capsnet_mnist"``,
        ``"efficient_capsnet_mnist"``).
    directory : str or os.PathLike
        Where ``<name>.encoder.onnx`` and ``<name>.decoder.onnx`` go.
    fp16 : bool or None, optional
        Large weights as float16; ``None`` (default): the model's choice in :data:`LIVE_MODELS`.

    Returns
    -------
    ExportedModel
        The files and the model's sizes.
    """
    check_choice(name, tuple(LIVE_MODELS), "name")
    fp16 = LIVE_MODELS[name] if fp16 is None else fp16
    model, _ = load_pretrained(name)
    d = Path(directory)
    enc = export_encoder(model, d / f"{name}.encoder.onnx", fp16=fp16)
    dec = export_decoder(model, d / f"{name}.decoder.onnx", fp16=fp16)
    c = model.config
    with torch.no_grad():
        iterations = EncoderGraph(model)(torch.zeros(1, c.in_channels, c.image_size, c.image_size))[2].shape[1]
    return ExportedModel(name, enc, dec, fp16, c.n_classes, c.class_dim, c.image_size, iterations)
