"""accelkit: plug a custom accelerator into PyTorch's distributed stack and prove it works.

``import accelkit`` is cheap: it imports neither torch.distributed.tensor nor any backend.
Sub-packages: :mod:`accelkit.core` (interfaces), :mod:`accelkit.backends` (reference
backends), :mod:`accelkit.conformance` (the suite).
"""

__version__ = "0.1.0"
