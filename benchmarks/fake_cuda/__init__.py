"""A fake-CUDA meter: real training steps on FakeTensorMode's "cuda" tensors in a CPU-only torch, the live fake
CUDA storages counted as the caching allocator rounds them. A test instrument: it imports nothing from kit/.

Importing this package imports no torch: :func:`fake_cuda.shim.load` must run first (see shim.py).
"""
