"""stfast: fast training of spatio-temporal travel-time models (DeepTTE) on GPS trajectories.

Importing stfast loads its native extension ``stfast._C`` (the fused ops, registered under
``torch.ops.stfast``); the extension must have been built against the torch that is imported.
"""
__version__ = "0.1.0"

_REBUILD = "pip install --no-build-isolation -e ."


def _load_extension():
    import torch

    try:
        from . import _C
    except ImportError as e:  # missing, or built against another torch (unresolved symbols)
        raise ImportError(
            f"stfast's native extension stfast._C is missing or does not load under torch {torch.__version__} "
            f"({e}). Build it in this environment: run {_REBUILD} (from the stfast checkout)") from e
    if _C.torch_version != torch.__version__:
        raise ImportError(
            f"stfast was built against torch {_C.torch_version} but torch {torch.__version__} is imported; "
            f"rebuild it against this torch: run {_REBUILD} (from the stfast checkout)")
    return _C


_C = _load_extension()

from . import _lazy  # noqa: E402

# stfast.nn, stfast.accum and stfast.parallel without an import of their own, each imported on first use, and
# stfast.load_model / TrainedModel (the public way to load a trained model) from stfast.train.trained: import
# stfast stays cheap, and the layers below train (which import the root for _C) do not import train through it
__getattr__, __dir__ = _lazy.lazy_exports(__name__, {"nn": (), "accum": (), "parallel": (),
                                                    "train.trained": ("TrainedModel", "load_model")})[1:]


def build_info() -> dict:
    """What the native extension was built with.

    Returns a dict: ``stfast_version`` (str), ``torch_version`` (str, the torch the extension was built
    against), ``cuda`` (bool, CUDA kernels compiled), ``cuda_version`` (str or None, torch's CUDA version
    at build time), ``nccl`` (bool, NCCL communicator compiled).
    """
    return {
        "stfast_version": _C.stfast_version,
        "torch_version": _C.torch_version,
        "cuda": bool(_C.with_cuda),
        "cuda_version": _C.cuda_version,
        "nccl": bool(_C.with_nccl),
    }


from . import ops  # noqa: F401  (fake kernels and autograd of torch.ops.stfast.*)
