// Writes the man pages muster(1), musterctl(1) and musterd(8) from the same
// definitions that give each binary its --help: muster's option table
// (launcher/cli/torchrun_options.cpp) and the CLI11 definitions of musterd and musterctl.
//   man_pages OUT_DIR
#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "cli.hpp"
#include "ctl_cli.hpp"
#include "daemon_cli.hpp"
#include "muster/common/version.hpp"

namespace {

// Text safe for roff: backslashes escaped, a leading dot or quote defused,
// hyphens in option names kept as hyphens.
std::string roff(const std::string& text) {
  std::string out;
  bool line_start = true;
  for (char c : text) {
    if (line_start && (c == '.' || c == '\'')) out += "\\&";
    if (c == '\\') out += "\\e";
    else if (c == '-') out += "\\-";
    else out += c;
    line_start = c == '\n';
  }
  return out;
}

std::string header(const std::string& name, int section) {
  return ".TH " + name + " " + std::to_string(section) + " \"\" \"muster " + muster::version_number() +
         "\" \"muster\"\n";
}

// The OPTIONS section of a CLI11 app (and of its subcommands' positionals).
std::string cli11_options(const CLI::App& app) {
  std::string out;
  for (const CLI::Option* o : app.get_options()) {
    std::string names;
    for (const auto& s : o->get_snames()) names += (names.empty() ? "" : ", ") + std::string("\\fB\\-") + s + "\\fR";
    for (const auto& l : o->get_lnames()) {
      names += (names.empty() ? "" : ", ") + std::string("\\fB") + roff("--" + l) + "\\fR";
    }
    if (names.empty()) continue;
    // CLI11's type name, less the range it appends ("UINT:UINT in [1 - 10]" -> "UINT").
    std::string type = o->get_type_name();
    type = type.substr(0, type.find(':'));
    if (!type.empty()) names += " \\fI" + roff(type) + "\\fR";
    out += ".TP\n" + names + "\n" + roff(o->get_description());
    if (!o->get_default_str().empty()) out += " (default: " + roff(o->get_default_str()) + ")";
    if (!o->get_envname().empty()) out += " (environment: " + roff(o->get_envname()) + ")";
    out += "\n";
  }
  return out;
}

std::string muster_page() {
  std::string p = header("muster", 1);
  p += ".SH NAME\nmuster \\- the torchrun\\-compatible launcher for distributed training\n";
  p += ".SH SYNOPSIS\n.B muster\n[\\fIoptions\\fR] \\fItraining_script\\fR [\\fIscript arguments\\fR ...]\n";
  p += ".SH DESCRIPTION\n"
       "The per\\-node agent: takes torchrun's command line, joins a rendezvous (static, c10d hosted by an agent, "
       "or musterd), starts one worker per \\fB\\-\\-nproc\\-per\\-node\\fR with the environment torchrun gives, "
       "supervises them, restarts the group on failure within \\fB\\-\\-max\\-restarts\\fR, follows membership "
       "changes, forwards signals and reports the failing rank. Options take both spellings "
       "(\\fB\\-\\-a\\-b\\fR and \\fB\\-\\-a_b\\fR) and unique prefixes.\n";
  p += ".SH OPTIONS\n";
  for (const auto& d : muster::launcher::option_docs()) {
    std::string names;
    for (const auto& n : d.names) {
      names += (names.empty() ? "" : ", ") + std::string("\\fB") + roff(n) + "\\fR";
      if (!d.metavar.empty()) names += " \\fI" + roff(d.metavar) + "\\fR";
    }
    p += ".TP\n" + names + "\n" + roff(d.help);
    if (!d.choices.empty()) {
      std::string list;
      for (const auto& c : d.choices) list += (list.empty() ? "" : ", ") + c;
      p += " Choices: " + roff(list) + ".";
    }
    if (d.default_value && !d.default_value->empty()) p += " Default: " + roff(*d.default_value) + ".";
    if (d.pet) {
      std::string env = d.dest;
      for (auto& c : env) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      p += " Environment default: " + roff("PET_" + env) + ".";
    }
    p += "\n";
  }
  p += ".SH ENVIRONMENT\n"
       ".TP\n.B PET_\\fINAME\\fR\nthe default of each torchrun option, as torchrun reads it.\n"
       ".TP\n.B MUSTER_AUTH_KEY_FILE\nthe rendezvous's shared key, when \\fB\\-\\-auth\\-key\\-file\\fR is not given.\n"
       ".TP\n.B CREDENTIALS_DIRECTORY\nsystemd's credentials: \\fImuster\\-auth\\-key\\fR there is the key when "
       "neither of the above is set.\n"
       ".TP\n.B TORCH_ELASTIC_SHUTDOWN_TIMEOUT\nseconds between the stop signal and SIGKILL (default 30).\n"
       ".TP\n.B PYTHON_EXEC\nthe interpreter that runs a Python training script.\n"
       ".TP\n.B LOGLEVEL\nthe agent's log level (default WARNING).\n"
       ".TP\n.B MUSTER_HEALTH_CHECK\\fR, \\fBMUSTER_HEALTH_CHECK_TIMEOUT\\fR, \\fBMUSTER_HEALTH_CHECK_INTERVAL\n"
       "\\fB\\-\\-health\\-check\\fR, \\fB\\-\\-health\\-check\\-timeout\\fR and "
       "\\fB\\-\\-health\\-check\\-interval\\fR when not given.\n"
       ".TP\n.B MUSTER_SSH\nwith \\fB\\-\\-hostfile\\fR or \\fB\\-\\-hosts\\fR: the ssh command (shell words, e.g. "
       "\\fIssh \\-p 2222 \\-i key\\fR; default \\fIssh\\fR).\n"
       ".TP\n.B MUSTER_SSH_FANOUT\nssh sessions set up at once (default 32).\n"
       ".TP\n.B MUSTER_REMOTE_PATH\nmuster's path on the hosts (default: this binary's, else muster on their PATH).\n"
       ".TP\n.B .muster_env\nNAME=VALUE lines in ~ and in the working directory, carried to every host of a "
       "launch over ssh.\n"
       ".TP\n.B MUSTER_PY_SPY\nthe py\\-spy that takes the Python stacks of hung workers (default: on PATH, "
       "else beside the workers' Python; empty: none).\n"
       ".TP\n.B CUDA_VISIBLE_DEVICES\\fR, \\fBCUDA_DEVICE_ORDER\n\\fB\\-\\-numa\\-binding\\fR binds local rank \\fIi\\fR "
       "by the GPU the CUDA driver calls device \\fIi\\fR under them.\n"
       ".TP\n.B HWLOC_FSROOT\nwhere \\fB\\-\\-numa\\-binding\\fR reads the machine's topology (default /).\n";
  p += ".SH EXIT STATUS\n0 when every worker succeeded; 1 when the job failed, a signal ended it, or the "
       "configuration is refused after parsing; 2 for a command line that does not parse.\n";
  p += ".SH SEE ALSO\n.BR musterd (8),\n.BR musterctl (1),\n.BR torchrun (1)\n";
  return p;
}

std::string musterd_page() {
  muster::daemon::Options opt;
  CLI::App app;
  muster::daemon::define(app, opt);
  std::string p = header("musterd", 8);
  p += ".SH NAME\nmusterd \\- the muster rendezvous daemon\n";
  p += ".SH SYNOPSIS\n.B musterd\n[\\fIoptions\\fR]\n";
  p += ".SH DESCRIPTION\n" + roff(app.get_description()) + "\n";
  p += ".SH OPTIONS\n" + cli11_options(app);
  p += ".SH SIGNALS\n.TP\n.B SIGTERM, SIGINT\nstop (systemd: STOPPING=1).\n"
       ".TP\n.B SIGHUP\nread the auth key again and rotate to it: the key it replaces is still accepted "
       "until the next reload (systemd: RELOADING=1, then READY=1).\n";
  p += ".SH ENVIRONMENT\n"
       ".TP\n.B MUSTER_AUTH_KEY_FILE\nthe shared key, when \\fB\\-\\-auth\\-key\\-file\\fR is not given.\n"
       ".TP\n.B CREDENTIALS_DIRECTORY\nsystemd's credentials: \\fImuster\\-auth\\-key\\fR there is the key when "
       "neither of the above is set (LoadCredential=).\n"
       ".TP\n.B NOTIFY_SOCKET, WATCHDOG_USEC\nsystemd's notification socket and watchdog: READY, STATUS, "
       "WATCHDOG at half the interval, RELOADING, STOPPING.\n"
       ".TP\n.B LOGLEVEL\nthe log level (default INFO).\n";
  p += ".SH EXIT STATUS\n0 after a stop signal; 1 when it cannot listen; 2 for a bad command line or key.\n";
  p += ".SH SEE ALSO\n.BR muster (1),\n.BR musterctl (1),\n.BR systemd.service (5)\n";
  return p;
}

std::string musterctl_page() {
  muster::ctl::Options opt;
  CLI::App app;
  muster::ctl::define(app, opt);
  std::string p = header("musterctl", 1);
  p += ".SH NAME\nmusterctl \\- ask a muster rendezvous what it is doing\n";
  p += ".SH SYNOPSIS\n.B musterctl\n[\\fIoptions\\fR] \\fBjobs\\fR\n.br\n.B musterctl\n[\\fIoptions\\fR] "
       "\\fBjob\\fR \\fIID\\fR\n";
  p += ".SH DESCRIPTION\n" + roff(app.get_description()) + "\n";
  p += ".SH COMMANDS\n";
  for (const CLI::App* sub : app.get_subcommands({})) {
    std::string args;
    for (const CLI::Option* o : sub->get_options()) {
      if (o->get_lnames().empty() && o->get_snames().empty()) args += " \\fI" + roff(o->get_name()) + "\\fR";
    }
    p += ".TP\n\\fB" + roff(sub->get_name()) + "\\fR" + args + "\n" + roff(sub->get_description()) + "\n";
  }
  p += ".SH OPTIONS\n" + cli11_options(app);
  p += ".SH EXIT STATUS\n0 on an answer; 1 when the rendezvous cannot be reached, refuses, or does not know the "
       "job; 2 for a bad command line.\n";
  p += ".SH SEE ALSO\n.BR muster (1),\n.BR musterd (8)\n";
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: man_pages OUT_DIR\n";
    return 2;
  }
  std::string dir = argv[1];
  struct Page {
    std::string file;
    std::string text;
  };
  for (const Page& page : {Page{"muster.1", muster_page()}, Page{"musterd.8", musterd_page()},
                           Page{"musterctl.1", musterctl_page()}}) {
    std::string path = dir + "/" + page.file;
    std::ofstream out(path + ".tmp", std::ios::binary);
    out << page.text;
    out.close();
    if (!out || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
      std::cerr << "man_pages: cannot write " << path << "\n";
      return 1;
    }
  }
  return 0;
}
