"""Helpers for tests, labs and the benchmark: request traces (pure mini) and a driver for the
real vLLM 0.22.1 classes on CPU (``real_vllm``, imported only when asked for)."""
