// A stand-in for PyTorch's libtorch_cpu.so, as far as the shim reads it: the exported
// `torch::autograd::get_current_node()`, returning the backward function the autograd engine
// runs on the calling thread (a `std::shared_ptr<Node>`, empty elsewhere), with nodes of the
// same C++ types as PyTorch's (`torch::autograd::generated::MmBackward0`, ...). It is not
// PyTorch's code: only that interface is the same.
//
// Driven through C (ctypes): standin_backward(size) runs a "backward pass" on a thread of its
// own, as PyTorch's autograd engine does (no Python runs there): MmBackward0 allocates a tensor
// of `size` bytes through the c10 stand-in, AddBackward0 another, and both stay live; it
// returns the first.
#include <cstddef>
#include <memory>
#include <thread>

extern "C" void *standin_malloc(size_t size);

namespace torch {
namespace autograd {
struct Node : std::enable_shared_from_this<Node> {
  virtual ~Node() {}
  virtual void *apply(size_t size) { return standin_malloc(size); }
};
namespace generated {
struct MmBackward0 : Node {};
struct AddBackward0 : Node {};
} // namespace generated

static thread_local std::shared_ptr<Node> current_evaluating_node;

__attribute__((visibility("default"))) std::shared_ptr<Node> get_current_node() {
  return current_evaluating_node;
}
} // namespace autograd
} // namespace torch

using namespace torch::autograd;

extern "C" __attribute__((visibility("default"))) void *standin_backward(size_t size) {
  void *first = nullptr;
  std::thread engine([&] {
    current_evaluating_node = std::make_shared<generated::MmBackward0>();
    first = current_evaluating_node->apply(size);
    current_evaluating_node = std::make_shared<generated::AddBackward0>();
    current_evaluating_node->apply(size / 2);
    current_evaluating_node.reset();
  });
  engine.join();
  return first;
}
