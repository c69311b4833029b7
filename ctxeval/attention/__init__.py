"""Attention methods (Self-Extend, ReRoPE, log-n, temperature): their exact math and chunked reference (methods),
their fused kernels (kernels), and the attention functions of a loaded model patched in place (patching)."""
