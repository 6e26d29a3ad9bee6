#include "stack_dump.hpp"

#include <boost/asio/post.hpp>

namespace muster::launcher {

StackDump::StackDump(boost::asio::io_context& io, std::string py_spy, std::chrono::milliseconds limit)
    : io_(io), py_spy_(std::move(py_spy)), limit_(limit) {}

StackDump::~StackDump() {
  if (!batch_) return;
  for (auto& run : batch_->runs) run->abandon();
}

bool StackDump::dump(std::vector<Target> targets, Done done) {
  if (batch_ || !available()) return false;
  auto b = std::make_shared<Batch>();
  b->done = std::move(done);
  b->open = targets.size();
  batch_ = b;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    Stack s;
    s.target = targets[i];
    b->stacks.push_back(std::move(s));
  }
  for (std::size_t i = 0; i < targets.size(); ++i) {
    ChildRun::Spec spec;
    spec.argv = {py_spy_, "dump", "--pid", std::to_string(targets[i].pid)};
    spec.limit = limit_;
    spec.max_output = kMaxStackBytes;
    b->runs.push_back(ChildRun::start(io_, std::move(spec), [this, b, i](ChildRun::Outcome o) {
      Stack& s = b->stacks[i];
      s.text = std::move(o.output);
      s.complete = o.ok();
      s.how_it_ended = o.started && !o.timed_out && o.exit_code == 127 ? "py-spy could not be run" : o.how();
      if (o.output_cut) s.how_it_ended += ", output cut at " + std::to_string(kMaxStackBytes) + " bytes";
      if (--b->open > 0 || batch_ != b) return;
      batch_.reset();
      auto finished = std::move(b->done);
      finished(std::move(b->stacks));
    }));
  }
  if (targets.empty()) {
    batch_.reset();
    auto finished = std::move(b->done);
    boost::asio::post(io_, [finished = std::move(finished)] { finished({}); });
  }
  return true;
}

}  // namespace muster::launcher
