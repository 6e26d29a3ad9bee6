#include "line_splitter.hpp"

namespace muster::launcher {

void LineSplitter::feed(std::string_view data, const Sink& sink) {
  while (!data.empty()) {
    std::size_t nl = data.find('\n');
    if (nl == std::string_view::npos) {
      pending_.append(data);
      while (pending_.size() >= max_line_) {
        sink(std::string_view(pending_).substr(0, max_line_), false);
        pending_.erase(0, max_line_);
      }
      return;
    }
    if (pending_.empty()) {
      sink(data.substr(0, nl), true);
    } else {
      // pending_ stays below max_line_, so this line is bounded by one read.
      pending_.append(data.substr(0, nl));
      sink(pending_, true);
      pending_.clear();
    }
    data.remove_prefix(nl + 1);
  }
}

void LineSplitter::finish(const Sink& sink) {
  if (pending_.empty()) return;
  sink(pending_, false);
  pending_.clear();
}

}  // namespace muster::launcher
