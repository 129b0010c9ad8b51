from torch import _standin

KiB = 1 << 10


def backward(saved, params, grad_bytes, keep=None):
    """As PyTorch's backward: the loss's gradient first (`_make_grads`, on the calling thread),
    then the saved activations freed (all but those `keep` holds) and each parameter's
    gradient from the engine thread: kept the first time, added in place (a temporary) after."""
    seed = _standin.empty(256 * KiB * _standin.BATCH)
    if _standin.REDUCE_ROWS:
        # A bias's gradient (768 outputs) summed over the batch's rows, the activations live.
        _standin.reduce_sum(_standin.REDUCE_ROWS * _standin.BATCH, 768)
    if _standin.BIAS:
        # Each layer's node, last layer first, makes its weight's gradient, then its bias's,
        # summed over the rows (through a staging buffer and semaphore once they are many,
        # both let go at once), the activations live.
        for p in reversed(params):
            half = 2 if _standin.BIAS16 else 1
            w = _standin.backward_node(p.node, grad_bytes // half)
            g = _standin.backward_node(p.node, 16 * KiB // half)
            rows = 192 * half * _standin.BATCH * _standin.SEQ
            size, semaphore = _standin.reduction_sizes(rows, 4096)
            if size:
                staging = _standin.backward_node(p.node, size)
                sem = _standin.backward_node(p.node, semaphore)
                _standin.free(sem)
                _standin.free(staging)
            for made, kept in ((w, "grad"), (g, "bias_grad")):
                if getattr(p, kept) is None:
                    setattr(p, kept, made)
                else:
                    _standin.free(made)
    for a in saved:
        if keep is None or a not in keep:
            _standin.free(a)
    for p in [] if _standin.BIAS else params:
        g = _standin.backward_tensor(grad_bytes)
        if p.grad is None:
            p.grad = g
        else:
            _standin.free(g)
    _standin.free(seed)
