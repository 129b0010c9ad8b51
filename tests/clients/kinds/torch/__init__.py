"""A stand-in for the parts of PyTorch's Python package whose frames tell what a tensor is for
(tests/kinds.rs): the same file paths and function names, tensors from the stand-in allocator."""
