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
    for a in saved:
        if keep is None or a not in keep:
            _standin.free(a)
    for p in params:
        g = _standin.backward_tensor(grad_bytes)
        if p.grad is None:
            p.grad = g
        else:
            _standin.free(g)
    _standin.free(seed)
