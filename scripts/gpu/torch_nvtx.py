"""Five training-like steps marked with torch.cuda.nvtx ranges, each allocating tensors; no code
knows about gpushim. Run under `gpushim run`, the ranges must appear in the trace."""
import torch

x = torch.zeros(1, device="cuda")
for step in range(5):
    torch.cuda.nvtx.range_push(f"step {step}")
    y = torch.randn(1024, 1024, device="cuda") @ torch.randn(1024, 1024, device="cuda")
    torch.cuda.nvtx.mark("after matmul")
    del y
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print("done")
