// muster --hostfile / --hosts: the launching command. It hosts the job's
// rendezvous (or uses the given endpoint), starts one agent on every host over
// ssh, brings every line of theirs back prefixed with its host, and holds the
// whole job to its own life.
//
// Contract. ssh sessions are set up at most FanoutConfig::fanout at a time;
// a session is set up once its agent has said it is ready (the channel's
// kReadyLine), and then stays open for the job's life, carrying the channel
// (launch_channel.hpp): the header with the job's key, heartbeats, stop
// orders. Each ssh runs in a session of its own (a terminal's Ctrl-C reaches
// this command only, which decides) and dies with this command (PDEATHSIG);
// a remote agent whose channel ends or falls silent ends its job by itself.
// A host that cannot be set up (ssh fails, muster missing or of another
// version, no directory, no answer within kSetupLimit) is named with what its
// ssh said; the job stops unless --nnodes=MIN:MAX lets it go on without the
// host. A signal stops every host's job with that signal, then, past
// --shutdown-timeout and kStopSlack, ends the ssh sessions. The exit status is
// the job's: 0 when every agent succeeded, else 1, never ssh's.
#pragma once

#include <chrono>

#include "argparse.hpp"
#include "fanout_config.hpp"

namespace muster::launcher {

constexpr std::chrono::seconds kSetupLimit{60};
constexpr std::chrono::seconds kStopSlack{15};
// After a host's agent failed while the job was ending anyway, how long the
// others get to end by themselves beyond --shutdown-timeout.
constexpr std::chrono::seconds kEndingGrace{30};
// A ready host's agent failed: how long the rendezvous gets to take in its
// last word before the launching command asks whether the job is ending.
constexpr std::chrono::seconds kDecideAfter{2};
// Lines of a host's stderr kept to quote when it fails.
constexpr std::size_t kStderrTail = 4;

int run_fanout(FanoutConfig fc, const Environment& env);

}  // namespace muster::launcher
