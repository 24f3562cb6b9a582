"""trtspec: speculative decoding on Triton Inference Server, with guard rails."""

__version__ = "0.3.0"
