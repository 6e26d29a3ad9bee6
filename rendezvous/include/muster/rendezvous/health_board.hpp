// The nodes whose health check fails, as they reported it (`health`,
// docs/protocol.md), per job: what `musterctl job` shows of nodes that stay
// out of a job. A node's entry goes when it joins the job (its check passed),
// or when it has not reported again by the time it said it would try again,
// plus that run's timeout, plus kHealthReportGrace (the agent is gone).
// Bounded: kMaxUnhealthyPerJob per job and kMaxHealthEntries in all; past
// either, the entry due to expire first makes room. No I/O, no clock of its own.
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "muster/rendezvous/core.hpp"
#include "muster/rendezvous/protocol.hpp"

namespace muster::rendezvous {

// A report holds at most a few KiB (names of kMaxNameLength, kMaxHealthDetail).
constexpr std::size_t kMaxHealthEntries = 8192;
// How long past its announced retry and that run's timeout a report is kept:
// the stop of a node's workers after a periodic check, and the report's way.
constexpr Duration kHealthReportGrace{120000};

class HealthBoard {
 public:
  struct Entry {
    HealthReport report;
    TimePoint reported;
    TimePoint expires;
  };

  void report(const HealthReport& r, TimePoint now);
  // The node joined the job: its check passed.
  void joined(const std::string& job, const std::string& node);
  // The job's failing nodes, by address then node; expired ones dropped first.
  std::vector<Entry> of(const std::string& job, TimePoint now);
  std::size_t jobs() const { return jobs_.size(); }
  std::size_t entries() const { return entries_; }  // held, expired ones not yet dropped included
  std::size_t live(TimePoint now) const;            // not expired

 private:
  void expire(TimePoint now);
  // Drops the entry due first: of `job`, or of any job when job is null.
  void evict(const std::string* job);

  void erase(std::map<std::string, std::map<std::string, Entry>>::iterator job,
             std::map<std::string, Entry>::iterator entry);

  std::map<std::string, std::map<std::string, Entry>> jobs_;  // job -> node -> entry
  std::size_t entries_ = 0;
  TimePoint next_expiry_ = TimePoint::max();  // no entry expires before (it may be earlier than needed)
};

}  // namespace muster::rendezvous
