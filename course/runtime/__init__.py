"""Learner-facing runtime helpers: what labs and tests import to drive the course and the real vLLM."""
