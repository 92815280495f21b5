#include "report.h"

#include <cstdio>
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

const char* BlockName(const Bundle& bundle, int block) { return block < 0 ? "*" : bundle.blocks[block].name; }

}  // namespace

void LogClaim(const Bundle& bundle, const Claim& claim, ClaimPolicy policy) {
  // A foreign subgraph (a control-flow body) is expected: info. Another model, a machine the kernels
  // cannot run on, or a block that does not match is a warning, the first few blocks by name (a
  // resized input declines them all for one reason).
  constexpr size_t kNamed = 3;
  size_t shown = 0;
  for (const Decline& d : claim.declined) {
    const LogLevel level = d.expected || shown >= kNamed ? LogLevel::kInfo : LogLevel::kWarning;
    shown += d.block >= 0;
    Log(level, "declined %s: %s", BlockName(bundle, d.block), d.reason.c_str());
  }
  if (shown > kNamed) Log(LogLevel::kWarning, "declined %zu more blocks (log_level:info names them)", shown - kNamed);
  if (claim.graph_matches) {
    Log(LogLevel::kInfo, "claimed %zu of %d blocks (%zu nodes), claim:%s, %d more left to TFLite by the policy",
        claim.blocks.size(), bundle.n_blocks, claim.nodes.size(), ClaimPolicyName(policy), claim.skipped);
  }
}

void RecordReport(DelegateState& state, const Claim& claim) {
  const Bundle& bundle = *state.bundle;
  std::string line = "{\"model\": " + JsonString(bundle.model) + ", \"target\": " + JsonString(bundle.target) +
                     ", \"graph_matches\": " +
                     (claim.graph_matches ? "true" : "false") + ", \"claim\": \"" +
                     ClaimPolicyName(state.options.claim) + "\", \"claimed_blocks\": [";
  for (size_t i = 0; i < claim.blocks.size(); ++i) {
    line += (i ? ", " : "") + JsonString(bundle.blocks[claim.blocks[i]].name);
  }
  line += "], \"claimed_nodes\": [";
  for (size_t i = 0; i < claim.nodes.size(); ++i) line += (i ? ", " : "") + std::to_string(claim.nodes[i]);
  line += "], \"declined\": [";
  for (size_t i = 0; i < claim.declined.size(); ++i) {
    line += std::string(i ? ", " : "") + "{\"block\": " + JsonString(BlockName(bundle, claim.declined[i].block)) +
            ", \"reason\": " + JsonString(claim.declined[i].reason) + "}";
  }
  line += "]}";
  std::lock_guard<std::mutex> lock(state.report_mutex);
  state.last_report = line;
  if (state.options.report.empty()) return;
  line += "\n";
  FILE* f = std::fopen(state.options.report.c_str(), "a");
  if (f == nullptr) {
    Log(LogLevel::kWarning, "cannot write the report to %s", state.options.report.c_str());
    return;
  }
  std::fputs(line.c_str(), f);
  std::fclose(f);
}

std::string LastReport(DelegateState& state) {
  std::lock_guard<std::mutex> lock(state.report_mutex);
  return state.last_report;
}

}  // namespace dnnfusion
