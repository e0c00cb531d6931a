"""NInfer model package: nn.Modules of the Qwen3.5/3.6 hybrid text model, its MTP head, and weight loading."""
