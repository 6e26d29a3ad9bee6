#include "muster/rendezvous/health_board.hpp"

#include <algorithm>

namespace muster::rendezvous {

void HealthBoard::report(const HealthReport& r, TimePoint now) {
  expire(now);
  const Duration keep = Duration(r.retry_in_ms) + Duration(r.check_timeout_ms);  // each at most a year
  Entry e{r, now, saturating_add(saturating_add(now, keep), kHealthReportGrace)};
  next_expiry_ = std::min(next_expiry_, e.expires);
  auto job = jobs_.find(r.job);
  if (job != jobs_.end()) {
    if (auto known = job->second.find(r.node); known != job->second.end()) {
      known->second = std::move(e);
      return;
    }
    if (job->second.size() >= kMaxUnhealthyPerJob) evict(&r.job);
  }
  if (entries_ >= kMaxHealthEntries) evict(nullptr);
  jobs_[r.job].emplace(r.node, std::move(e));
  ++entries_;
}

void HealthBoard::joined(const std::string& job, const std::string& node) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  if (auto e = it->second.find(node); e != it->second.end()) erase(it, e);
}

std::vector<HealthBoard::Entry> HealthBoard::of(const std::string& job, TimePoint now) {
  expire(now);
  std::vector<Entry> out;
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return out;
  for (const auto& [node, e] : it->second) out.push_back(e);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.report.address != b.report.address ? a.report.address < b.report.address : a.report.node < b.report.node;
  });
  return out;
}

std::size_t HealthBoard::live(TimePoint now) const {
  std::size_t n = 0;
  for (const auto& [job, nodes] : jobs_) {
    for (const auto& [node, e] : nodes) n += e.expires > now ? 1 : 0;
  }
  return n;
}

void HealthBoard::expire(TimePoint now) {
  if (now < next_expiry_) return;  // nothing due: no scan
  next_expiry_ = TimePoint::max();
  for (auto job = jobs_.begin(); job != jobs_.end();) {
    auto& nodes = job->second;
    for (auto e = nodes.begin(); e != nodes.end();) {
      if (e->second.expires <= now) {
        e = nodes.erase(e);
        --entries_;
      } else {
        next_expiry_ = std::min(next_expiry_, e->second.expires);
        ++e;
      }
    }
    job = nodes.empty() ? jobs_.erase(job) : std::next(job);
  }
}

void HealthBoard::erase(std::map<std::string, std::map<std::string, Entry>>::iterator job,
                        std::map<std::string, Entry>::iterator entry) {
  job->second.erase(entry);
  --entries_;
  if (job->second.empty()) jobs_.erase(job);
}

void HealthBoard::evict(const std::string* job) {
  std::map<std::string, std::map<std::string, Entry>>::iterator first_job = jobs_.end();
  std::map<std::string, Entry>::iterator first;
  for (auto j = jobs_.begin(); j != jobs_.end(); ++j) {
    if (job != nullptr && j->first != *job) continue;
    for (auto e = j->second.begin(); e != j->second.end(); ++e) {
      if (first_job == jobs_.end() || e->second.expires < first->second.expires) {
        first_job = j;
        first = e;
      }
    }
  }
  if (first_job != jobs_.end()) erase(first_job, first);
}

}  // namespace muster::rendezvous
