// The agent in a multi-node job: it hosts the job's rendezvous when it should
// (RendezvousHost, rendezvous_host.hpp), joins it through its
// RendezvousMember (rendezvous_member.hpp), starts its workers on each
// assignment, and hands the rendezvous's orders to the core.
#include <unistd.h>

#include "agent.hpp"
#include "exposure.hpp"
#include "group_assignment.hpp"
#include "muster/common/endpoint.hpp"
#include "muster/common/log.hpp"
#include "rdzv_conf.hpp"

namespace muster::launcher {

Status Agent::setup_rendezvous() {
  const bool is_static = cfg_.rdzv_backend == "static";
  auto ep = parse_endpoint(cfg_.rdzv_endpoint, is_static ? -1 : 29400);
  if (!ep.ok()) return ep.status();
  MemberSettings settings = member_settings(cfg_);
  MemberIdentity id;
  id.job = cfg_.rdzv_id;
  id.role = cfg_.role;
  id.address = cfg_.local_addr ? *cfg_.local_addr : host_;
  id.local_world_size = cfg_.nproc_per_node;
  if (is_static) id.node_rank = cfg_.node_rank;
  id.launch_order = cfg_.launch_order;
  std::optional<rendezvous::auth::Key> auth_key;

  auto from_env = [this](const char* name) { return env_or(env_, name, ""); };
  auto key = rendezvous::auth::find_key(cfg_.auth_key_file, from_env("MUSTER_AUTH_KEY_FILE").c_str(),
                                        from_env("CREDENTIALS_DIRECTORY").c_str());
  if (!key.ok()) return key.status();
  if (cfg_.launch_key_hex) {
    auto bytes = rendezvous::auth::from_hex(*cfg_.launch_key_hex, cfg_.launch_key_hex->size() / 2);
    if (!bytes) return Status(Code::invalid_argument, "the launching command's key is not hex");
    auth_key.emplace(std::move(*bytes));
    log::info("the rendezvous is authenticated with the key the launching command made for this job");
  } else if (key.value()) {
    auth_key.emplace(key.value()->key);
    log::info("the rendezvous is authenticated with the key from " + key.value()->source);
  }
  rdzv_host_ = std::make_unique<RendezvousHost>(io_, cfg_.rdzv_id, auth_key);

  if (is_static) {
    // Node rank 0 serves the workers' store and the rendezvous on --master-port
    // (config_from_args checked the rank and that the endpoint has a port).
    // Node rank 0's port carries the workers' store and the rendezvous: it
    // listens where the other nodes are told to reach it.
    std::string bind = listen_address_for(strip_brackets(ep->host));
    if (cfg_.node_rank == 0) {
      if (auto st = rdzv_host_->open_static(store_host_, bind, ep->port); !st.ok()) return st;
    } else if (auto st = store_host_.serve(bind, 0); !st.ok()) {
      return Status(Code::unavailable, "cannot serve this node's store: " + st.message());
    }
  } else {
    // With c10d the workers' store is opened per round, before each join.
    auto hosting = rdzv_host_->open_c10d(*ep, NodeNames{host_, cfg_.local_addr}, cfg_.rdzv.is_host);
    if (!hosting.ok()) return hosting.status();
  }
  id.is_host = rdzv_host_->hosting();
  RendezvousMember::Events events;
  events.assigned = [this](const rendezvous::out::Assign& a) { on_assigned(a); };
  events.restart = [this](bool counts_as_failure) { apply(core_.on_restart_order(counts_as_failure)); };
  events.finish = [this](int code, const std::optional<rendezvous::FailureInfo>& root_cause) {
    if (root_cause && !finished()) job_root_cause_ = root_cause;
    apply(core_.on_finish_order(code, root_cause.has_value()));
  };
  events.fenced = [this] { apply(core_.on_fenced()); };
  events.failed = [this](const Status& st) { on_rendezvous_failed(st); };
  events.stacks_requested = [this](const std::string& reason) { take_requested_stacks(reason); };
  events.round_store = [this, is_static, address = id.address]() -> Result<int> {
    // Each round gets a store of its own, advertised with its join: workers
    // of the round that ended cannot write into it, and nobody resets it
    // under the new round's workers. The static backend's store stays on
    // --master-port and keeps its keys, as torchrun's does: emptying it could
    // cut off the other nodes' rendezvous connections that share its port.
    if (!is_static) {
      if (auto st = store_host_.new_round(listen_address_for(address)); !st.ok()) return st;
    }
    return store_host_.port();
  };
  member_ = std::make_unique<RendezvousMember>(io_, ep->host, ep->port, std::move(settings), std::move(id),
                                               std::move(auth_key), core_, std::move(events));
  if (is_static && cfg_.node_rank == 0) rdzv_host_->reserve_own_rank(0, member_->name());
  return planner_.resolve_executable(env_);
}

int Agent::run_coordinated() {
  if (auto st = setup_rendezvous(); !st.ok()) return fail_start_up(st);
  events_.set_executable(planner_.executable_path());
  open_stack_dump();
  io_.poll();  // a signal during start-up ends the run before anything starts
  if (!finished()) {
    join_when_healthy("first_join", [this] { member_->start(); });
    io_.run();
  }
  return core_.exit_code().value_or(1);
}

void Agent::on_assigned(const rendezvous::out::Assign& a) {
  group_ = placed_group(cfg_, a);
  log::info("[" + cfg_.role + "] Rendezvous complete for workers. Result:\n  restart_count=" +
            std::to_string(a.restart_count) + "\n  master_addr=" + group_.master_addr +
            "\n  master_port=" + std::to_string(group_.master_port) + "\n  group_rank=" +
            std::to_string(group_.group_rank) + "\n  group_world_size=" + std::to_string(group_.group_world_size));
  apply(core_.on_assignment(a.restart_count));
}

void Agent::on_rendezvous_failed(const Status& st) {
  if (finished()) return;
  if (!core_.stopped_by_signal()) say("muster: error: " + st.message() + "\n");
  // Workers running: they are stopped, then the run ends; none: it ends now.
  apply(core_.on_rendezvous_lost());
}

void Agent::report_to_rendezvous_failure(int local_rank) {
  auto failure = reporter_.rendezvous_failure(local_rank, member_->address());
  if (const WorkerExit* e = reporter_.exit_of(local_rank)) {
    failure.failed_at_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(e->when.time_since_epoch()).count();
  }
  // --exclude-exit-code: the worker asks for this node to be taken out.
  if (cfg_.exclude_exit_code && failure.exitcode == *cfg_.exclude_exit_code) {
    failure.exclude_node = true;
    log::warning("[" + cfg_.role + "] worker " + std::to_string(local_rank) + " exited with " +
                 std::to_string(failure.exitcode) + " (--exclude-exit-code): asking the rendezvous to exclude this node");
  }
  member_->report_failure(failure);
}

}  // namespace muster::launcher
