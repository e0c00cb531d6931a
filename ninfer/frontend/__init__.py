"""NInfer frontend package."""
