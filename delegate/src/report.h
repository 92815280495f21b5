// Saying what was claimed: a log line per Prepare, and (option `report`) one JSON line per
// Prepare appended to a file, which `tflite_tools run` and the tests read.
#pragma once

#include "claim.h"
#include "delegate_state.h"

namespace dnnfusion {

void LogClaim(const Bundle& bundle, const Claim& claim, ClaimPolicy policy);

// Appends {"graph_matches", "claimed_blocks", "claimed_nodes", "declined": [{"block", "reason"}]}.
void AppendReport(DelegateState& state, const Claim& claim);

}  // namespace dnnfusion
