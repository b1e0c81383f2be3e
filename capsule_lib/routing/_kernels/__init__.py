"""The routing algorithms' hand-written CPU kernels, one module per algorithm, below the readable forms in
``routing/<algorithm>.py``. They are chosen in one place, :func:`~capsule_lib.routing._common.use_kernel`, and each
is tested equal to its plain path in float64 (values and gradients, ``tests/test_fused_kernels.py``)."""
