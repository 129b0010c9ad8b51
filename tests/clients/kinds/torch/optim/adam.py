import time

from torch import _standin

MiB = 1 << 20


class Adam:
    def __init__(self, params, state_bytes, temporary_bytes=1 * MiB):
        self.params = params
        self.state_bytes = state_bytes
        self.temporary_bytes = temporary_bytes
        self.state = {}

    def step(self, pause=0.0):
        """One step: a temporary per parameter (1 MiB, or as asked), each freed at once; with `pause`
        (seconds), as PyTorch's foreach implementation does, all of them made first and then
        freed, with that pause after the first."""
        made = []
        for i, p in enumerate(self.params):
            if i not in self.state:
                self.state[i] = _standin.empty(self.state_bytes)  # optimizer state
            t = _standin.empty(self.temporary_bytes)  # a temporary of the step
            if not pause:
                _standin.free(t)
                continue
            made.append(t)
            if i == 0:
                time.sleep(pause)
        for t in made:
            _standin.free(t)
