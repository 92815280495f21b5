// Saying what was claimed: a log line per Prepare, and one JSON line per Prepare, kept as the
// last report (the Java API's claimReport()) and, with option `report`, appended to a file, which
// `tflite_tools run` and the tests read.
#pragma once

#include <string>

#include "claim.h"
#include "delegate_state.h"

namespace dnnfusion {

void LogClaim(const Claim& claim, ClaimPolicy policy);

// Appends {"model", "target", "graph_matches", "subgraph", "subgraph_name", "claim", "claimed_blocks",
// "claimed_nodes", "declined": [{"block", "reason"}]}
// to the `report` file, when the option names one.
void RecordReport(DelegateState& state, const Claim& claim);

// Appends `text` to the file at `path` (created if missing) without ever blocking the host: a FIFO
// with no reader, a full disk or a short write fail it. The first failure per option is a warning
// ("cannot write the <what> to <path>"), later ones are silent. The caller holds report_mutex.
void AppendOrWarn(const std::string& path, const std::string& text, const char* what, bool* warned);

}  // namespace dnnfusion
