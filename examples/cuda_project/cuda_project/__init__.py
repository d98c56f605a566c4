"""A small model library written for CUDA. The demo runs it unchanged."""
