"""CUDA tensors shared between processes with torch.multiprocessing: PyTorch exports the base of
its block with cudaIpcGetMemHandle and the offset on the side; under gpushim its blocks are
carved from the pool's segments, so most exports are pooled blocks inside a segment.

The producer fills tensors of several sizes with distinct values and sends them to a consumer
process, which checks every element, overwrites the second tensor and reports; the producer
then checks that write and that the others are intact. Prints 'RESULT {json}'."""
import json

import torch
import torch.multiprocessing as mp

SIZES = (3 << 20, 5 << 20, 7 << 20, 1000, 300_000)


def consumer(q, done):
    ts = q.get()
    right = [bool((t == i + 1).all()) for i, t in enumerate(ts)]
    ts[1].fill_(99.0)
    torch.cuda.synchronize()
    done.put(right)
    q.get()  # hold the tensors until the producer has looked


if __name__ == "__main__":
    mp.set_start_method("spawn")
    # Leave a freed 256 MiB segment in the pool below PyTorch, so the next segments PyTorch
    # asks for are carved from it (at offsets other than 0).
    x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.empty_cache()
    ts = [torch.full((n,), float(i + 1), device="cuda") for i, n in enumerate(SIZES)]
    torch.cuda.synchronize()
    q, done = mp.Queue(), mp.Queue()
    p = mp.Process(target=consumer, args=(q, done))
    p.start()
    q.put(ts)
    right = done.get(timeout=300)
    torch.cuda.synchronize()
    wrote = bool((ts[1] == 99.0).all())
    intact = all(bool((t == i + 1).all()) for i, t in enumerate(ts) if i != 1)
    q.put("done")
    p.join()
    print("RESULT " + json.dumps({"peer_saw_right_values": right, "peer_write_seen": wrote,
                                  "others_intact": intact, "peer_exit": p.exitcode}), flush=True)
