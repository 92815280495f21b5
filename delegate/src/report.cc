#include "report.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "log.h"

namespace dnnfusion {
namespace {

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

const char* BlockName(const Claim& claim, int block) {
  return block < 0 || claim.graph == nullptr ? "*" : claim.graph->blocks[block].name;
}

}  // namespace

void LogClaim(const Claim& claim, ClaimPolicy policy) {
  // A foreign subgraph (a control-flow body) is expected: info. Another model, a machine the kernels
  // cannot run on, or a block that does not match is a warning, the first few blocks by name (a
  // resized input declines them all for one reason).
  constexpr size_t kNamed = 3;
  size_t shown = 0;
  for (const Decline& d : claim.declined) {
    const LogLevel level = d.expected || shown >= kNamed ? LogLevel::kInfo : LogLevel::kWarning;
    shown += d.block >= 0;
    Log(level, "declined %s: %s", BlockName(claim, d.block), d.reason.c_str());
  }
  if (shown > kNamed) Log(LogLevel::kWarning, "declined %zu more blocks (log_level:info names them)", shown - kNamed);
  if (claim.graph != nullptr) {
    Log(LogLevel::kInfo, "claimed %zu of %d blocks (%zu nodes) in subgraph %d (%s), claim:%s, %d more left to TFLite "
        "by the policy", claim.blocks.size(), claim.graph->n_blocks, claim.nodes.size(), claim.graph->subgraph,
        claim.graph->name, ClaimPolicyName(policy), claim.skipped);
  }
}

void RecordReport(DelegateState& state, const Claim& claim) {
  if (state.options.report.empty()) return;  // the line goes nowhere else
  const Bundle& bundle = *state.bundle;
  std::string line = "{\"model\": " + JsonString(bundle.model) + ", \"target\": " + JsonString(bundle.target) +
                     ", \"graph_matches\": " + (claim.graph_matches ? "true" : "false") +
                     ", \"subgraph\": " + (claim.graph ? std::to_string(claim.graph->subgraph) : "null") +
                     ", \"subgraph_name\": " + (claim.graph ? JsonString(claim.graph->name) : "null") + ", \"claim\": \"" +
                     ClaimPolicyName(state.options.claim) + "\", \"claimed_blocks\": [";
  for (size_t i = 0; i < claim.blocks.size(); ++i) {
    line += (i ? ", " : "") + JsonString(claim.graph->blocks[claim.blocks[i]].name);
  }
  line += "], \"claimed_nodes\": [";
  for (size_t i = 0; i < claim.nodes.size(); ++i) line += (i ? ", " : "") + std::to_string(claim.nodes[i]);
  line += "], \"declined\": [";
  for (size_t i = 0; i < claim.declined.size(); ++i) {
    line += std::string(i ? ", " : "") + "{\"block\": " + JsonString(BlockName(claim, claim.declined[i].block)) +
            ", \"reason\": " + JsonString(claim.declined[i].reason) + "}";
  }
  line += "]}";
  std::lock_guard<std::mutex> lock(state.report_mutex);
  AppendOrWarn(state.options.report, line + "\n", "report", &state.report_warned);
}

void AppendOrWarn(const std::string& path, const std::string& text, const char* what, bool* warned) {
  // O_NONBLOCK: opening a FIFO nobody reads fails (ENXIO) instead of hanging the host's invoke.
  const int fd = open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  bool ok = fd >= 0;
  for (size_t done = 0; ok && done < text.size();) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    done += ok ? static_cast<size_t>(n) : 0;
  }
  if (fd >= 0 && close(fd) != 0) ok = false;  // NFS and some filesystems report ENOSPC only here
  if (!ok && !*warned) {
    *warned = true;
    Log(LogLevel::kWarning, "cannot write the %s to %s (%s)", what, path.c_str(), std::strerror(errno));
  }
}

}  // namespace dnnfusion
