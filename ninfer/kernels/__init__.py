"""NInfer kernels package."""
