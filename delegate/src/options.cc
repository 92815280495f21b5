#include "options.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace dnnfusion {
namespace {

bool ParseInt(const char* text, int lo, int hi, int* out) {
  if (text == nullptr || *text == '\0') return false;
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(text, &end, 10);
  if (errno != 0 || *end != '\0' || value < lo || value > hi) return false;
  *out = static_cast<int>(value);
  return true;
}

bool ParseClaimPolicy(const char* text, ClaimPolicy* out) {
  for (int32_t i = 0; i < kClaimPolicyCount; ++i) {
    if (std::strcmp(text, kClaimPolicyNames[i]) == 0) {
      *out = static_cast<ClaimPolicy>(i);
      return true;
    }
  }
  return false;
}

}  // namespace

int KernelThreads(const Options& options, int recommended) {
  return options.num_threads > 0 ? options.num_threads : recommended > 0 ? recommended : 1;
}

ClaimPolicy DefaultClaim(const Bundle& bundle, int threads, ClaimPolicy fallback) {
  const int32_t policy = threads > 1 ? bundle.default_claim_threaded : bundle.default_claim;
  return policy >= 0 && policy < kClaimPolicyCount ? static_cast<ClaimPolicy>(policy) : fallback;
}

const char* ClaimPolicyName(ClaimPolicy policy) {
  const auto number = static_cast<int32_t>(policy);
  return number >= 0 && number < kClaimPolicyCount ? kClaimPolicyNames[number] : "?";
}

bool ParseOptions(const char* const* keys, const char* const* values, size_t count, Options* out,
                  std::string* error) {
  for (size_t i = 0; i < count; ++i) {
    const std::string key = keys[i] ? keys[i] : "";
    const char* value = values[i] ? values[i] : "";
    if (key == "num_threads") {
      // -1 is what benchmark_model and tflite-runtime pass for "let the runtime decide".
      if (!ParseInt(value, -1, 256, &out->num_threads)) {
        *error = "num_threads: expected an integer from -1 to 256, got '" + std::string(value) + "'";
        return false;
      }
      if (out->num_threads < 0) out->num_threads = 0;
    } else if (key == "log_level") {
      if (!ParseLogLevel(value, &out->log_level)) {
        *error = "log_level: expected silent, error, warning, info or verbose, got '" + std::string(value) + "'";
        return false;
      }
    } else if (key == "claim") {
      out->claim_given = true;
      if (!ParseClaimPolicy(value, &out->claim)) {
        std::string expected;
        for (int32_t i = 0; i < kClaimPolicyCount; ++i) {
          expected += std::string(i == 0 ? "" : i + 1 == kClaimPolicyCount ? " or " : ", ") + kClaimPolicyNames[i];
        }
        *error = "claim: expected " + expected + ", got '" + std::string(value) + "'";
        return false;
      }
    } else if (key == "require_device") {
      if (std::strcmp(value, "true") != 0 && std::strcmp(value, "false") != 0) {
        *error = "require_device: expected true or false, got '" + std::string(value) + "'";
        return false;
      }
      out->require_device = std::strcmp(value, "true") == 0;
    } else if (key == "report") {
      out->report = value;
    } else if (key == "profile") {
      out->profile = value;
    } else if (key == "blocks") {
      out->blocks.clear();
      std::string list = value;
      for (size_t start = 0; start <= list.size();) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) end = list.size();
        if (end > start) out->blocks.push_back(list.substr(start, end - start));
        start = end + 1;
      }
      // An empty list would mean "no restriction" (claim every block): refused as claim="" is.
      if (out->blocks.empty()) {
        *error = "blocks: expected block names separated by commas, got '" + list + "'";
        return false;
      }
    } else {
      *error = "unknown option '" + key + "' (known: num_threads, log_level, claim, blocks, report, profile, "
               "require_device)";
      return false;
    }
  }
  return true;
}

}  // namespace dnnfusion
