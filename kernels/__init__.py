"""Triton kernels (rms_norm, fused_add_rms_norm, silu_and_mul) with their PyTorch references."""
