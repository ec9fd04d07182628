"""stfast: fast training of spatio-temporal travel-time models (DeepTTE) on GPS trajectories.

Importing stfast imports neither torch nor its native extension, so the data tools (readers, trips store,
``stfast data convert``) start fast. The extension ``stfast._C`` (the fused ops, registered under
``torch.ops.stfast``, with their fake kernels and autograd from :mod:`stfast.ops`) loads on first use: when
``stfast.ops`` (and so ``stfast.nn``, the models, training) is imported, or ``stfast._C`` or
:func:`build_info` is asked for. It must have been built against the torch that is imported (ImportError
saying how to rebuild otherwise).
"""
__version__ = "0.1.0"

from ._native import REBUILD as _REBUILD
from ._native import native_missing as _native_missing


def _load_extension():
    import importlib

    import torch

    try:
        _C = importlib.import_module(f"{__name__}._C")
    except ImportError as e:  # missing, or built against another torch (unresolved symbols)
        raise ImportError(_native_missing("_C", f"{e}; torch {torch.__version__}")) from e
    if _C.torch_version != torch.__version__:
        raise ImportError(
            f"stfast was built against torch {_C.torch_version} but torch {torch.__version__} is imported; "
            f"rebuild it against this torch: run {_REBUILD} (from the stfast checkout)")
    return _C


from . import _lazy  # noqa: E402

# stfast.nn, stfast.accum and stfast.parallel without an import of their own, each imported on first use, and
# stfast.load_model / TrainedModel (the public way to load a trained model) from stfast.train.trained (and the
# error its predict raises on data outside the training area, stfast.OutsideTrainingArea): import
# stfast stays cheap, and the layers below train (which import the root for _C) do not import train through it
_lazy_getattr, __dir__ = _lazy.lazy_exports(__name__, {"nn": (), "accum": (), "parallel": (),
                                                       "train.trained": ("TrainedModel", "load_model"),
                                                       "data.coverage": ("OutsideTrainingArea",)})[1:]


def __getattr__(name: str):
    if name != "_C":
        return _lazy_getattr(name)
    try:  # the extension, checked against torch, then the Python face of its ops
        globals()["_C"] = _load_extension()
    except ImportError:
        globals().pop("_C", None)  # the import system set the unchecked module: the next use checks again
        raise
    from . import ops  # noqa: F401  (fake kernels and autograd of torch.ops.stfast.*)

    return globals()["_C"]


def build_info() -> dict:
    """What the native extension was built with.

    Returns a dict: ``stfast_version`` (str), ``torch_version`` (str, the torch the extension was built
    against), ``cuda`` (bool, CUDA kernels compiled), ``cuda_version`` (str or None, torch's CUDA version
    at build time), ``nccl`` (bool, NCCL communicator compiled).
    """
    ext = globals().get("_C") or __getattr__("_C")
    return {
        "stfast_version": ext.stfast_version,
        "torch_version": ext.torch_version,
        "cuda": bool(ext.with_cuda),
        "cuda_version": ext.cuda_version,
        "nccl": bool(ext.with_nccl),
    }
