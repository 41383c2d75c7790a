"""One module a framework (TensorFlow, PyTorch, JAX), each the only importer of it."""
