// Internal: a torch.export program (one models/<name>.json of a .pt2 archive) compiled for running
// node by node through libtorch's dispatcher: each node's op found once, its arguments prepared
// (the archive's enums as c10's, defaults from the op's schema, device arguments as the run's
// device, Python numbers as wrapped-number tensors where the op takes a tensor). A run records
// autograd as a direct call does, so backward works; in-place ops on buffers (BatchNorm's running
// statistics) mutate the tensors given. Symbolic-shape arithmetic (_operator.*, torch.sym_*) runs
// natively; the higher-order ops cond, while_loop, wrap_with_set_grad_enabled and wrap_with_autocast
// run their subgraphs. Anything else is refused, in one line, when the program is compiled.
#pragma once

#include <ATen/core/ivalue.h>

#include <memory>
#include <string>
#include <vector>

#include "pt2/pt2_archive.hpp"

namespace mpiddp::detail {

/// The schema major version (torch/_export/serde/schema.py) of the programs mpiddp runs: PyTorch 2.6
/// to 2.14 write 8; a program of another major is refused (as torch.export.load refuses one).
constexpr int64_t kPt2SchemaMajor = 8;

/// How one of the program's inputs is bound (its signature's input_specs, in order).
struct Pt2Input {
  enum class Kind { Parameter, Buffer, Constant, User, Value };
  Kind kind = Kind::User;
  std::string target;      ///< the parameter's, buffer's or constant's name (none for a user input)
  c10::IValue value;       ///< Kind::Value: the constant it is
  bool persistent = true;  ///< Kind::Buffer: in the module's state_dict (else a constant of the archive)
};

/// What one of the program's outputs is (its signature's output_specs, in order).
struct Pt2Output {
  enum class Kind { User, BufferMutation, ParameterMutation, Ignored };
  Kind kind = Kind::User;
  std::string target;  ///< the mutated buffer's or parameter's name
};

class Pt2Graph;

class Pt2Program {
 public:
  /// Compiles a program; `where` names it in messages ("'m.pt2' program 'model'"). Throws
  /// mpiddp::Error (one line): another schema major, an op this libtorch lacks, a node mpiddp
  /// cannot run, an input kind it cannot bind (custom objects, tokens).
  Pt2Program(const Json& program, std::string where);
  ~Pt2Program();
  Pt2Program(const Pt2Program&) = delete;
  Pt2Program& operator=(const Pt2Program&) = delete;

  const std::vector<Pt2Input>& inputs() const { return inputs_; }
  const std::vector<Pt2Output>& outputs() const { return outputs_; }
  /// Each user input's sizes as exported, -1 for a dynamic dimension (empty: not a tensor).
  const std::vector<std::vector<int64_t>>& user_input_sizes() const { return user_input_sizes_; }
  /// Runs the graph on one value per inputs(); a device argument in the graph means `device`.
  /// Throws mpiddp::Error naming the node whose op failed.
  std::vector<c10::IValue> run(std::vector<c10::IValue> inputs, c10::Device device) const;

 private:
  std::string where_;
  std::vector<Pt2Input> inputs_;
  std::vector<Pt2Output> outputs_;
  std::vector<std::vector<int64_t>> user_input_sizes_;
  std::unique_ptr<Pt2Graph> graph_;
};

}  // namespace mpiddp::detail
