#include "shared_port.hpp"

#include <array>

#include "muster/common/log.hpp"
#include "muster/net/asio_tcp.hpp"
#include "muster/rendezvous/protocol.hpp"

namespace muster::launcher {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {
constexpr std::size_t kDecidingBytes = 5;  // the frame's length, then its first byte
}  // namespace

SharedPort::Verdict SharedPort::classify(std::string_view in) {
  if (in.empty()) return Verdict::need_more;
  if (static_cast<unsigned char>(in[0]) != 0) return Verdict::store;
  if (in.size() < kDecidingBytes) return Verdict::need_more;
  std::uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length = (length << 8) | static_cast<unsigned char>(in[static_cast<std::size_t>(i)]);
  bool frame = length >= 1 && length <= rendezvous::kMaxFrame && in[4] == '{';
  return frame ? Verdict::rendezvous : Verdict::store;
}

SharedPort::SharedPort(asio::io_context& io, Handoff to_store, Handoff to_rendezvous)
    : acceptor_(io),
      to_store_(std::move(to_store)),
      to_rendezvous_(std::move(to_rendezvous)) {}

SharedPort::~SharedPort() { close(); }

Result<std::unique_ptr<SharedPort>> SharedPort::listen(asio::io_context& io, const std::string& host, int port,
                                                       Handoff to_store, Handoff to_rendezvous) {
  std::unique_ptr<SharedPort> shared(new SharedPort(io, std::move(to_store), std::move(to_rendezvous)));
  SharedPort* self = shared.get();
  auto bound = self->acceptor_.listen(host, port, "the store", "store",
                                      [self](tcp::socket socket) { self->take(std::move(socket)); });
  if (!bound.ok()) return bound.status();
  return shared;
}

// A new connection: held undecided until its first bytes say whose it is.
void SharedPort::take(tcp::socket socket) {
  boost::system::error_code ec;
  auto remote = socket.remote_endpoint(ec);
  std::string peer = ec ? std::string("?") : remote.address().to_string();
  auto& from_peer = per_peer_[peer];
  if (undecided_.size() >= kMaxUndecided || from_peer >= kMaxUndecidedPerPeer) {
    auto now = std::chrono::steady_clock::now();
    if (now - last_refusal_logged_ >= std::chrono::seconds(5)) {
      last_refusal_logged_ = now;
      log::warning("port " + std::to_string(acceptor_.port()) + ": closing a connection from " + peer +
                   ": " + std::to_string(from_peer) + " of its connections (" +
                   std::to_string(undecided_.size()) +
                   " in all) have not yet said whether they are for the store or the rendezvous");
    }
    if (from_peer == 0) per_peer_.erase(peer);
    socket.close(ec);
    return;
  }
  ++from_peer;
  std::uint64_t id = next_id_++;
  undecided_[id] = Undecided{std::make_shared<tcp::socket>(std::move(socket)), peer};
  read_more(id, std::make_shared<std::string>());
}

void SharedPort::read_more(std::uint64_t id, std::shared_ptr<std::string> bytes) {
  auto it = undecided_.find(id);
  if (it == undecided_.end()) return;
  auto socket = it->second.socket;
  auto buf = std::make_shared<std::array<char, 64>>();
  socket->async_read_some(
      asio::buffer(*buf), [this, id, bytes, buf, socket, alive = acceptor_.alive()](const boost::system::error_code& ec,
                                                                        std::size_t n) {
        if (!*alive) return;
        auto found = undecided_.find(id);
        if (found == undecided_.end()) return;
        if (ec) {  // gone before it said anything that decides
          forget(found);
          return;
        }
        bytes->append(buf->data(), n);
        Verdict v = classify(*bytes);
        if (v == Verdict::need_more) return read_more(id, bytes);
        forget(found);
        auto& to = v == Verdict::rendezvous ? to_rendezvous_ : to_store_;
        to(std::move(*socket), std::move(*bytes));
      });
}

void SharedPort::forget(std::map<std::uint64_t, Undecided>::iterator it) {
  auto peer = per_peer_.find(it->second.peer);
  if (peer != per_peer_.end() && --peer->second == 0) per_peer_.erase(peer);
  undecided_.erase(it);
}

void SharedPort::close() {
  if (!acceptor_.open()) return;
  acceptor_.close();
  boost::system::error_code ignored;
  for (auto& [id, u] : undecided_) u.socket->close(ignored);
  undecided_.clear();
  per_peer_.clear();
}

}  // namespace muster::launcher
