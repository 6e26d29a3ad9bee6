// What a process group is set up from: ProcessGroupOptions where a field is
// given, else the environment that torchrun (or muster) gives each worker
// (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE, TORCHELASTIC_RESTART_COUNT) and muster's own
// knobs (MUSTER_CPU_TRANSPORT, MUSTER_NODE_ID, MUSTER_SHM_SLOT_BYTES). Every
// value is checked here, once; an error says what to set (muster::Error).
// (MUSTER_ADVERTISE_ADDR, which only a multi-node group uses, is read where
// the rings form, in process_group.cpp.)
#pragma once

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>

#include "muster/process_group.hpp"

namespace muster::detail {

constexpr std::size_t kMaxGroupName = 128;
constexpr std::size_t kDefaultSlotBytes = 512 << 10;

struct GroupSettings {
  int rank = 0;
  int world = 1;
  std::optional<int> local_rank;   // as the launcher said; else found from the nodes
  std::optional<int> local_size;
  int restart = 0;
  std::chrono::milliseconds timeout{};
  std::string name;                // "" for an unnamed group
  std::string master_addr;
  int master_port = 0;
  bool agent_store = false;        // a store already serves MASTER_ADDR:MASTER_PORT
  bool tcp_only = false;           // MUSTER_CPU_TRANSPORT=tcp: every rank a node of its own
  std::optional<std::string> node_id;  // MUSTER_NODE_ID, when set and not empty
  std::size_t slot_bytes = kDefaultSlotBytes;
};

GroupSettings read_group_settings(const ProcessGroupOptions& options);

// The environment variable's value, if set.
std::optional<std::string> env(const char* name);

}  // namespace muster::detail
