"""Python face of stfast's native ops (``torch.ops.stfast.*``): typed wrappers, fake kernels for
torch.compile, autograd, and pure-PyTorch references (used by the tests and as benchmark baselines)."""
from .. import _C  # noqa: F401  (loads the native extension, checked against torch: the ops below are its)
from . import autocast  # noqa: F401  (Autocast kernels of the fused ops: bf16-mixed)
from .geo_conv import (
                       geo_conv_packed,
                       geo_conv_padded,
                       geo_conv_reference,
                       output_offsets,
                       padded_offsets,
)
from .gemm import gemm_libraries_available, gemm_library, gemm_rates, reset_gemm_library, select_gemm_library
from .lstm import lstm_packed, lstm_padded, lstm_reference, offsets_to_lengths
from .workspace import cpu_workspace_cached_bytes, empty_cpu_workspace_cache

__all__ = ["cpu_workspace_cached_bytes", "empty_cpu_workspace_cache", "gemm_libraries_available", "gemm_library",
           "gemm_rates", "geo_conv_packed", "geo_conv_padded", "geo_conv_reference", "lstm_packed", "lstm_padded", "lstm_reference", "offsets_to_lengths",
           "output_offsets", "padded_offsets", "reset_gemm_library", "select_gemm_library"]
