"""The routing algorithms' hand-written CPU kernels, one module per algorithm, below the readable forms in
``routing/<algorithm>.py``. They are chosen by one rule, :func:`~capsule_lib.routing._common.use_kernel`, which each
algorithm module calls (a kernel never chooses itself), and each is tested equal to its plain path in float64 (values
and gradients, ``tests/test_fused_kernels.py``). A kernel imports nothing from its algorithm module: what it shares
with the plain path (dynamic routing's loop, EM's M- and E-steps) is passed in as an argument
(``tests/test_architecture.py`` refuses import cycles)."""
