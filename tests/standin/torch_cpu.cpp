// A stand-in for PyTorch's libtorch_cpu.so, as far as the shim reads it: the exported
// `torch::autograd::get_current_node()`, returning the backward function the autograd engine
// runs on the calling thread (a `std::shared_ptr<Node>`, empty elsewhere), with nodes of the
// same C++ types as PyTorch's (`torch::autograd::generated::MmBackward0`, ...) and their first
// fields where PyTorch's lie (the sequence number, ...); and `at::sequence_number::peek()`, the
// number the calling thread's next node takes. It is not PyTorch's code: only that interface
// is the same.
//
// Driven through C (ctypes): standin_backward(size) runs a "backward pass" on a thread of its
// own, as PyTorch's autograd engine does (no Python runs there): MmBackward0 allocates a tensor
// of `size` bytes through the c10 stand-in, AddBackward0 another, and both stay live; it
// returns the first. standin_forward_mm(size) is an op of a forward: it makes an MmBackward0
// node (taking the thread's next sequence number), then allocates its output (the caller's
// Python line records the number after it), and keeps the node (standin_forward_cast(size)
// the same with a ToCopyBackward0, a cast); standin_backward_kept(size)
// then runs every kept node on an engine thread, each allocating `size` bytes;
// standin_backward_one(size) one node, one tensor (below; standin_backward_split(size) the same
// as a split's SplitWithSizesBackward0); standin_backward_node(i, size) the
// i-th kept node alone (nodes are kept in the order made), as the engine runs a graph's nodes
// one by one in reverse.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

extern "C" void *standin_malloc(size_t size);

namespace at {
namespace sequence_number {
static thread_local uint64_t next_number = 0;
__attribute__((visibility("default"))) uint64_t peek() { return next_number; }
__attribute__((visibility("default"))) uint64_t get_and_increment() { return next_number++; }
} // namespace sequence_number
} // namespace at

namespace torch {
namespace autograd {
struct Node;
// Where one input of a node came from: the node that made it (empty: none), and which of that
// node's outputs.
struct Edge {
  std::shared_ptr<Node> function;
  uint32_t input_nr = 0;
};
struct Node : std::enable_shared_from_this<Node> {
  Node() : sequence_nr_(at::sequence_number::get_and_increment()) {}
  explicit Node(uint64_t sequence_nr) : sequence_nr_(sequence_nr) {}
  virtual ~Node() {}
  virtual void *apply(size_t size) { return standin_malloc(size); }
  // PyTorch's Node begins its fields so (after the vtable pointer and the weak pointer of
  // enable_shared_from_this), its mutex and its inputs' edges next.
  const uint64_t sequence_nr_;
  uint64_t topological_nr_ = 0;
  mutable bool has_parent_ = false;
  uint64_t thread_id_ = 1;
  std::mutex mutex_;
  std::vector<Edge> next_edges_;
};
// A parameter's node: no sequence number (PyTorch gives it UINT64_MAX).
struct AccumulateGrad : Node {
  AccumulateGrad() : Node(UINT64_MAX) {}
};
namespace generated {
struct MmBackward0 : Node {};
struct AddBackward0 : Node {};
struct ToCopyBackward0 : Node {};
struct NativeLayerNormBackward0 : Node {};
struct NllLossBackward0 : Node {};
struct SplitWithSizesBackward0 : Node {};
struct AddmmBackward0 : Node {};
} // namespace generated

static thread_local std::shared_ptr<Node> current_evaluating_node;

__attribute__((visibility("default"))) std::shared_ptr<Node> get_current_node() {
  return current_evaluating_node;
}
} // namespace autograd
} // namespace torch

using namespace torch::autograd;

static std::vector<std::shared_ptr<Node>> kept;

// standin_forward_op(kind, size): an op of a forward making a node of class `kind` (0
// MmBackward0, 1 ToCopyBackward0, 2 AddBackward0, 3 NativeLayerNormBackward0, 4
// NllLossBackward0, 5 AddmmBackward0), then its output of `size` bytes (none for 0), as
// standin_forward_mm.
extern "C" __attribute__((visibility("default"))) void *standin_forward_op(int kind, size_t size) {
  std::shared_ptr<Node> node;
  switch (kind) {
  case 0: node = std::make_shared<generated::MmBackward0>(); break;
  case 1: node = std::make_shared<generated::ToCopyBackward0>(); break;
  case 2: node = std::make_shared<generated::AddBackward0>(); break;
  case 3: node = std::make_shared<generated::NativeLayerNormBackward0>(); break;
  case 5: node = std::make_shared<generated::AddmmBackward0>(); break;
  default: node = std::make_shared<generated::NllLossBackward0>(); break;
  }
  kept.push_back(node);
  return size ? standin_malloc(size) : nullptr;
}

// standin_link(i, j): the next input of the i-th kept node came from the j-th kept node's
// output 0; standin_link_leaf(i): from a parameter (an AccumulateGrad of its own);
// standin_link_none(i): from a tensor that takes no gradient. The engine's walk of a graph
// follows these, as PyTorch's `next_edges_`.
extern "C" __attribute__((visibility("default"))) void standin_link(size_t i, size_t j) {
  if (i < kept.size() && j < kept.size()) {
    kept[i]->next_edges_.push_back(Edge{kept[j], 0});
  }
}

extern "C" __attribute__((visibility("default"))) void standin_link_leaf(size_t i) {
  if (i < kept.size()) {
    kept[i]->next_edges_.push_back(Edge{std::make_shared<AccumulateGrad>(), 0});
  }
}

// standin_forward_broken(size): as standin_forward_mm, but the node's edges lead to memory
// nobody mapped (what a PyTorch whose Node is laid out otherwise would show the shim). The
// node is never destroyed: its vector is not one.
extern "C" __attribute__((visibility("default"))) void *standin_forward_broken(size_t size) {
  auto *node = new generated::MmBackward0();
  auto **words = reinterpret_cast<uintptr_t **>(&node->next_edges_);
  uintptr_t *nowhere = reinterpret_cast<uintptr_t *>(uintptr_t{4096});
  words[0] = nowhere;
  words[1] = nowhere + 6;
  words[2] = nowhere + 6;
  kept.push_back(std::shared_ptr<Node>(node, [](Node *) {}));
  return standin_malloc(size);
}

extern "C" __attribute__((visibility("default"))) void standin_link_none(size_t i) {
  if (i < kept.size()) {
    kept[i]->next_edges_.push_back(Edge{});
  }
}

extern "C" __attribute__((visibility("default"))) void *standin_forward_mm(size_t size) {
  kept.push_back(std::make_shared<generated::MmBackward0>());
  return standin_malloc(size);
}

// standin_forward_cast(size): a cast of a forward (autocast's 16-bit copy of a weight): a
// ToCopyBackward0 node, then its output, as standin_forward_mm.
extern "C" __attribute__((visibility("default"))) void *standin_forward_cast(size_t size) {
  kept.push_back(std::make_shared<generated::ToCopyBackward0>());
  return standin_malloc(size);
}

extern "C" __attribute__((visibility("default"))) void standin_backward_kept(size_t size) {
  std::thread engine([&] {
    for (auto &node : kept) {
      current_evaluating_node = node;
      node->apply(size);
    }
    current_evaluating_node.reset();
  });
  engine.join();
}

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

// standin_backward_one(size): one MmBackward0 on an engine thread allocates one tensor of
// `size` bytes and returns it (a gradient, or a temporary the caller frees).
// One node of type `N` on an engine thread allocates one tensor of `size` bytes.
template <typename N> static void *backward_by(size_t size) {
  void *out = nullptr;
  std::thread engine([&] {
    current_evaluating_node = std::make_shared<N>();
    out = current_evaluating_node->apply(size);
    current_evaluating_node.reset();
  });
  engine.join();
  return out;
}

extern "C" __attribute__((visibility("default"))) void *standin_backward_one(size_t size) {
  return backward_by<generated::MmBackward0>(size);
}

// standin_backward_split(size): one SplitWithSizesBackward0 on an engine thread allocates one
// tensor of `size` bytes and returns it: the gradients of a split's views joined into the
// gradient of what was split (FSDP1's flat parameter's, from its parameters' views).
extern "C" __attribute__((visibility("default"))) void *standin_backward_split(size_t size) {
  return backward_by<generated::SplitWithSizesBackward0>(size);
}

// standin_backward_node(i, size): the i-th node made by standin_forward_mm, run on an engine
// thread, allocates one tensor of `size` bytes and returns it (null: no such node).
extern "C" __attribute__((visibility("default"))) void *standin_backward_node(size_t i,
                                                                              size_t size) {
  if (i >= kept.size()) {
    return nullptr;
  }
  void *out = nullptr;
  std::thread engine([&] {
    current_evaluating_node = kept[i];
    out = current_evaluating_node->apply(size);
    current_evaluating_node.reset();
  });
  engine.join();
  return out;
}
